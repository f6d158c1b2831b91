package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
	"github.com/blobfs/blobfs/mountopt"
)

// Volume parameters (StorageClass parameters, PV volumeAttributes, inline
// volumeAttributes). The names are the Azure Blob CSI driver's where the
// meaning is the same, so that StorageClasses and PVs move over; like that
// driver, keys are matched without regard to case.
const (
	paramStorageAccount      = "storageaccount"
	paramContainerName       = "containername"
	paramContainerNamePrefix = "containernameprefix"
	paramServer              = "server"
	paramProtocol            = "protocol"
	paramSecretName          = "secretname"
	paramSecretNamespace     = "secretnamespace"
	paramMountOptions        = "mountoptions"
	paramAuthType            = "azurestorageauthtype"
	paramIdentityClientID    = "azurestorageidentityclientid"
	paramEndpointSuffix      = "storageendpointsuffix"
	paramFSGroupChangePolicy = "fsgroupchangepolicy"
	paramKeyVaultURL         = "keyvaulturl"
	paramKeyVaultSecret      = "keyvaultsecretname"
	paramKeyVaultVersion     = "keyvaultsecretversion"
	// paramRetainContainer is blobfs's own: "true" keeps the container
	// (and its data) when the volume is deleted.
	paramRetainContainer = "retaincontainer"

	// Keys that the external-provisioner (--extra-create-metadata) and
	// kubelet add. Every key with this prefix is accepted.
	sidecarPrefix     = "csi.storage.k8s.io/"
	keyPVCName        = "csi.storage.k8s.io/pvc/name"
	keyPVCNamespace   = "csi.storage.k8s.io/pvc/namespace"
	keyPVName         = "csi.storage.k8s.io/pv/name"
	keyEphemeral      = "csi.storage.k8s.io/ephemeral"
	keyPodNamespace   = "csi.storage.k8s.io/pod.namespace"
	keyServiceAccount = "csi.storage.k8s.io/serviceAccount.name"

	// The external-provisioner writes its identity
	// (storage.kubernetes.io/csiProvisionerIdentity) into the volume
	// attributes of every PV it creates, so NodeStageVolume and
	// NodePublishVolume receive it. Keys with this prefix are accepted
	// and ignored.
	kubernetesPrefix = "storage.kubernetes.io/"
)

// knownParams are the accepted parameter names, as users write them (for
// error messages); matching is on the lower-case form.
// The Azure Blob CSI driver's other names are in blobcsi.go.
var knownParams = []string{
	"storageAccount", "containerName", "containerNamePrefix", "server",
	"storageEndpointSuffix", "protocol", "secretName", "secretNamespace",
	"mountOptions", "retainContainer", "AzureStorageAuthType",
	"AzureStorageIdentityClientID", "fsGroupChangePolicy",
	"keyVaultURL", "keyVaultSecretName", "keyVaultSecretVersion",
}

// Secret keys, as in the Azure Blob CSI driver, plus a connection string.
// msisecret (blob-csi-driver's, for a custom managed identity endpoint) is
// accepted and not used; its service principal keys are refused
// (blobcsi.go).
const (
	secretAccountName = "azurestorageaccountname"
	secretAccountKey  = "azurestorageaccountkey"
	secretSASToken    = "azurestorageaccountsastoken"
	secretConnString  = "azurestorageconnectionstring"
	secretMSI         = "msisecret"
)

var knownSecrets = []string{secretAccountName, secretAccountKey, secretSASToken, secretConnString, secretMSI}

// volumeParams is a parsed parameter map.
type volumeParams struct {
	StorageAccount      string
	ContainerName       string
	ContainerNamePrefix string
	Server              string // endpoint: a URL or a host name
	SecretName          string
	SecretNamespace     string
	// KeyVaultURL, KeyVaultSecretName and KeyVaultSecretVersion name the
	// Key Vault secret that holds the volume's account key or SAS token
	// (keyvault.go).
	KeyVaultURL           string
	KeyVaultSecretName    string
	KeyVaultSecretVersion string
	MountOptions          []string
	RetainContainer       bool
	AuthType              string
	IdentityClientID      string
	// EndpointSuffix (storageEndpointSuffix) makes the endpoint
	// https://ACCOUNT.blob.SUFFIX/ when Server is not given.
	EndpointSuffix string
	// NoFSGroup (fsGroupChangePolicy None): the pod's fsGroup is not
	// applied to the mount.
	NoFSGroup bool
	// AccountSettings are the parameters, as "name=value", that set up a
	// storage account blob-csi-driver would create or pick
	// (blobcsi.go): fine with an existing account, refused without.
	AccountSettings []string

	PVCName, PVCNamespace, PVName string
	Ephemeral                     bool
	PodNamespace                  string
}

// parseParams checks a parameter map. field names the request field for
// error messages ("parameters", "volume_context"). Unknown keys are an
// error that names the key, except the keys the sidecars and kubelet add.
func parseParams(m map[string]string, field string) (volumeParams, error) {
	var p volumeParams
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys) // report the same key first every time
	for _, k := range keys {
		v := strings.TrimSpace(m[k])
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, sidecarPrefix) {
			switch lk {
			case keyPVCName:
				p.PVCName = v
			case keyPVCNamespace:
				p.PVCNamespace = v
			case keyPVName:
				p.PVName = v
			case keyEphemeral:
				b, err := strconv.ParseBool(v)
				if err != nil {
					return p, fmt.Errorf("%s[%q]: %q is not true or false", field, k, clip(v, 40))
				}
				p.Ephemeral = b
			case strings.ToLower(keyPodNamespace):
				p.PodNamespace = v
			}
			continue
		}
		if strings.HasPrefix(lk, kubernetesPrefix) {
			continue
		}
		switch lk {
		case paramStorageAccount:
			if v != "" && !validAccount(v) {
				return p, fmt.Errorf("%s[%q]: %q is not a storage account name (3 to 24 lowercase letters and digits)", field, k, clip(v, 40))
			}
			p.StorageAccount = v
		case paramContainerName:
			p.ContainerName = v
		case paramContainerNamePrefix:
			p.ContainerNamePrefix = v
		case paramServer:
			if v != "" {
				if err := blobstore.CheckEndpoint(serverEndpoint(v)); err != nil {
					return p, fmt.Errorf("%s[%q]: %v", field, k, err)
				}
			}
			p.Server = v
		case paramProtocol:
			if err := checkProtocol(v); err != nil {
				return p, fmt.Errorf("%s: %s=%s: %v", field, k, clip(v, 40), err)
			}
		case paramEndpointSuffix:
			if v != "" && !validEndpointSuffix(v) {
				return p, fmt.Errorf("%s[%q]: %q is not a DNS suffix like core.windows.net", field, k, clip(v, 60))
			}
			p.EndpointSuffix = strings.ToLower(strings.Trim(v, "."))
		case paramFSGroupChangePolicy:
			switch strings.ToLower(v) {
			case "", "onrootmismatch", "always":
			case "none":
				p.NoFSGroup = true
			default:
				return p, fmt.Errorf("%s[%q]: %q is not OnRootMismatch, Always or None", field, k, clip(v, 40))
			}
		case paramKeyVaultURL:
			p.KeyVaultURL = v
		case paramKeyVaultSecret:
			p.KeyVaultSecretName = v
		case paramKeyVaultVersion:
			p.KeyVaultSecretVersion = v
		case paramSecretName:
			p.SecretName = v
		case paramSecretNamespace:
			p.SecretNamespace = v
		case paramMountOptions:
			for _, o := range strings.Split(v, ",") {
				if o = strings.TrimSpace(o); o != "" {
					p.MountOptions = append(p.MountOptions, o)
				}
			}
		case paramRetainContainer:
			b, err := strconv.ParseBool(v)
			if err != nil {
				return p, fmt.Errorf("%s[%q]: %q is not true or false", field, k, clip(v, 40))
			}
			p.RetainContainer = b
		case paramAuthType:
			switch strings.ToLower(v) {
			case "", "key", "sas", "connstr", "azuread", "msi", "workloadidentity", "spn":
				p.AuthType = strings.ToLower(v)
			default:
				return p, fmt.Errorf("%s[%q]: auth type %q is not one of key, sas, connstr, azuread (msi, workloadidentity)", field, k, clip(v, 40))
			}
		case paramIdentityClientID:
			p.IdentityClientID = v
		default:
			cp, ok := compatParamNamed(lk)
			if !ok {
				return p, unknownParam(field, k)
			}
			if cp.check != nil {
				if err := cp.check(v); err != nil {
					return p, fmt.Errorf("%s: %s=%s: %v", field, k, clip(v, 60), err)
				}
			}
			if cp.accountSetting {
				p.AccountSettings = append(p.AccountSettings, k+"="+clip(v, 60))
			}
		}
	}
	if err := checkKeyVault(p.KeyVaultURL, p.KeyVaultSecretName, p.KeyVaultSecretVersion); err != nil {
		return p, fmt.Errorf("%s: %v", field, err)
	}
	return p, nil
}

// unknownParam refuses a name blobfs and blob-csi-driver do not know,
// suggesting the closest known one (a typo, usually).
func unknownParam(field, k string) error {
	known := append(append([]string{}, knownParams...), compatParamNames()...)
	hint := ""
	if c := closestName(k, known); c != "" {
		hint = fmt.Sprintf("; did you mean %q?", c)
	}
	return fmt.Errorf("%s: unknown parameter %q%s (known: %s, and csi.storage.k8s.io/*, storage.kubernetes.io/*)", field, clip(k, 80), hint, strings.Join(known, ", "))
}

// secretNamespaceFor is the namespace of the secretName Secret when
// secretNamespace is not given, as blob-csi-driver picks it: the one a
// blob-csi-driver volume handle names, else the PVC's, else "default".
func (p volumeParams) secretNamespaceFor(handleNamespace string) string {
	for _, ns := range []string{p.SecretNamespace, handleNamespace, p.PVCNamespace} {
		if ns != "" {
			return ns
		}
	}
	return "default"
}

// contextFor returns the volume context that CreateVolume hands to the
// node: what NodeStageVolume needs beyond the volume id. No secrets.
func (p volumeParams) contextFor() map[string]string {
	ctx := map[string]string{}
	set := func(k, v string) {
		if v != "" {
			ctx[k] = v
		}
	}
	set("secretName", p.SecretName)
	set("secretNamespace", p.SecretNamespace)
	set("mountOptions", strings.Join(p.MountOptions, ","))
	set("AzureStorageAuthType", p.AuthType)
	set("AzureStorageIdentityClientID", p.IdentityClientID)
	if p.NoFSGroup {
		set("fsGroupChangePolicy", "None")
	}
	return ctx
}

// endpoint turns the server parameter into a blob endpoint URL: a URL is
// kept, a bare host name (as the Azure Blob CSI driver takes it, e.g.
// acct.privatelink.blob.core.windows.net) gets https://.
func (p volumeParams) endpoint() string {
	return serverEndpoint(p.Server)
}

func serverEndpoint(s string) string {
	if s == "" || strings.Contains(s, "://") {
		return s
	}
	return "https://" + s + "/"
}

// credentials are what a request's secrets (or a referenced Secret) hold.
// Never logged, never persisted.
type credentials struct {
	Account    string
	Key        string
	SASToken   string
	ConnString string
}

func (c credentials) empty() bool {
	return c.Key == "" && c.SASToken == "" && c.ConnString == ""
}

// parseSecrets reads the secret keys. An unknown key is an error that
// names the key (never a value).
func parseSecrets(m map[string]string, field string) (credentials, error) {
	var c credentials
	for k, v := range m {
		v = strings.TrimSpace(v)
		switch strings.ToLower(k) {
		case secretAccountName:
			c.Account = v
		case secretAccountKey:
			c.Key = v
		case secretSASToken:
			c.SASToken = v
		case secretConnString:
			c.ConnString = v
		case secretMSI:
			// blobfuse's secret for a custom managed identity endpoint
			// (MSIEndpoint, refused): the node's own identity needs none.
		default:
			if why, ok := refusedSecretKeys[strings.ToLower(k)]; ok {
				// "KEY is", not "KEY:": "clientsecret: x" reads as a
				// secret value to blobstore.Redact.
				return c, fmt.Errorf("%s: key %s is refused: %s", field, strings.ToLower(k), why)
			}
			return c, fmt.Errorf("%s: unknown key %q (known: %s)", field, clip(k, 80), strings.Join(knownSecrets, ", "))
		}
	}
	n := 0
	for _, s := range []string{c.Key, c.SASToken, c.ConnString} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return c, fmt.Errorf("%s: give one of %s, %s or %s, not several", field, secretAccountKey, secretSASToken, secretConnString)
	}
	if c.Account != "" && !validAccount(c.Account) {
		return c, fmt.Errorf("%s[%s]: not a storage account name (3 to 24 lowercase letters and digits)", field, secretAccountName)
	}
	return c, nil
}

// azureConfig combines where the container is and how to authenticate. With
// no credentials it uses Azure AD (workload or managed identity).
func azureConfig(id volumeID, creds credentials, p volumeParams) (blobstore.AzureConfig, error) {
	if creds.Account != "" && creds.Account != id.Account {
		return blobstore.AzureConfig{}, fmt.Errorf("secret %s %q does not match the volume's storage account %q", secretAccountName, creds.Account, id.Account)
	}
	cfg := blobstore.AzureConfig{
		Account:          id.Account,
		Container:        id.Container,
		Endpoint:         id.Endpoint,
		Key:              creds.Key,
		SASToken:         creds.SASToken,
		ConnectionString: creds.ConnString,
		ClientID:         p.IdentityClientID,
	}
	switch {
	case p.AuthType == "msi" || p.AuthType == "workloadidentity" || p.AuthType == "spn":
		cfg.Auth = blobstore.AzureAuthAzureAD
	case p.AuthType != "":
		cfg.Auth = p.AuthType
	case creds.empty():
		cfg.Auth = blobstore.AzureAuthAzureAD
	}
	if cfg.Auth == blobstore.AzureAuthAzureAD {
		cfg.Key, cfg.SASToken, cfg.ConnectionString = "", "", ""
	} else {
		cfg.ClientID = ""
	}
	// A connection string names account and endpoint itself; Validate
	// reports a conflict with the volume's.
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// target returns where a container lives: account and endpoint from the
// parameters, else from the credentials. With no account anywhere, the
// parameters that would have set up a new account (blob-csi-driver makes
// or finds one) are named in the error.
func (p volumeParams) target(creds credentials) (account, endpoint string, err error) {
	account, endpoint = p.StorageAccount, p.endpoint()
	if creds.Account != "" {
		if account != "" && account != creds.Account {
			return "", "", fmt.Errorf("parameter storageAccount %q does not match secret %s %q", account, secretAccountName, creds.Account)
		}
		account = creds.Account
	}
	if creds.ConnString != "" && (account == "" || endpoint == "") {
		// Let blobstore parse the connection string: it knows the format.
		cfg := blobstore.AzureConfig{Container: "probe", ConnectionString: creds.ConnString, Auth: blobstore.AzureAuthConnString}
		if err := cfg.Validate(); err != nil {
			return "", "", fmt.Errorf("secret %s: %v", secretConnString, err)
		}
		a, e := connStringTarget(creds.ConnString)
		if account == "" {
			account = a
		}
		if endpoint == "" && p.EndpointSuffix == "" && e != defaultEndpoint(account) {
			endpoint = e
		}
	}
	if account == "" && len(p.AccountSettings) > 0 {
		return "", "", fmt.Errorf("%s: blobfs does not create storage accounts (nor search for one, as blob-csi-driver does when none is named); name an existing one with storageAccount or the secret's %s", strings.Join(p.AccountSettings, ", "), secretAccountName)
	}
	if account == "" {
		return "", "", fmt.Errorf("no storage account: set parameter storageAccount or secret key %s (blobfs does not create storage accounts or search for one)", secretAccountName)
	}
	if !validAccount(account) {
		return "", "", fmt.Errorf("storage account %q is not valid (3 to 24 lowercase letters and digits)", account)
	}
	if endpoint == "" && p.EndpointSuffix != "" {
		endpoint = "https://" + account + ".blob." + p.EndpointSuffix + "/"
	}
	if endpoint == defaultEndpoint(account) {
		endpoint = ""
	}
	return account, endpoint, nil
}

// connStringTarget reads AccountName and the blob endpoint from a
// connection string, as blobstore does (kept in step with
// blobstore.parseConnectionString; only names and URLs, never the key).
func connStringTarget(s string) (account, endpoint string) {
	kv := map[string]string{}
	for _, part := range strings.Split(s, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok {
			kv[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	if strings.EqualFold(kv["usedevelopmentstorage"], "true") {
		return blobstore.AzuriteAccount, "http://127.0.0.1:10000/" + blobstore.AzuriteAccount
	}
	account, endpoint = kv["accountname"], kv["blobendpoint"]
	if endpoint == "" && account != "" {
		proto, suffix := kv["defaultendpointsprotocol"], kv["endpointsuffix"]
		if proto == "" {
			proto = "https"
		}
		if suffix == "" {
			suffix = "core.windows.net"
		}
		endpoint = fmt.Sprintf("%s://%s.blob.%s/", proto, account, strings.Trim(suffix, "/"))
	}
	if account == "" && endpoint != "" {
		// path-style (Azurite) or host-style endpoint
		rest := endpoint[strings.Index(endpoint, "://")+3:]
		host, path, _ := strings.Cut(rest, "/")
		if seg, _, _ := strings.Cut(strings.Trim(path, "/"), "/"); seg != "" {
			account = seg
		} else {
			account, _, _ = strings.Cut(host, ".")
		}
	}
	return account, endpoint
}

// containerNameFor picks the container of a new volume: the containerName
// parameter (with the Azure Blob CSI driver's ${pvc.metadata.name},
// ${pvc.metadata.namespace} and ${pv.metadata.name} templates), else the
// PVC's namespace and name, else the volume name; containerNamePrefix
// goes in front. Names that are not valid container names are made valid,
// with a hash of the original appended so that different names stay
// different.
func containerNameFor(name string, p volumeParams) (string, error) {
	if p.ContainerName != "" {
		if !strings.Contains(p.ContainerName, "${") {
			if err := (volumeID{Account: "acc", Container: p.ContainerName}).check(); err != nil {
				return "", fmt.Errorf("parameter containerName: %v", err)
			}
			return p.ContainerName, nil
		}
		r := strings.NewReplacer("${pvc.metadata.name}", p.PVCName, "${pvc.metadata.namespace}", p.PVCNamespace, "${pv.metadata.name}", p.PVName)
		s := r.Replace(p.ContainerName)
		if strings.Contains(s, "${") {
			return "", fmt.Errorf("parameter containerName: unknown template in %q (known: ${pvc.metadata.name}, ${pvc.metadata.namespace}, ${pv.metadata.name}; the first two need the provisioner's --extra-create-metadata)", clip(p.ContainerName, 80))
		}
		return sanitizeContainerName(s), nil
	}
	base := name
	if p.PVCName != "" && p.PVCNamespace != "" {
		base = p.PVCNamespace + "-" + p.PVCName
	}
	if p.ContainerNamePrefix != "" {
		prefix := sanitizeContainerName(p.ContainerNamePrefix)
		if prefix != p.ContainerNamePrefix && prefix != strings.ToLower(p.ContainerNamePrefix) || len(p.ContainerNamePrefix) > 32 {
			return "", fmt.Errorf("parameter containerNamePrefix %q: use at most 32 lowercase letters, digits and single hyphens", clip(p.ContainerNamePrefix, 80))
		}
		base = strings.ToLower(p.ContainerNamePrefix) + "-" + base
	}
	return sanitizeContainerName(base), nil
}

// sanitizeContainerName maps s to a valid container name: lowercase
// letters, digits and single inner hyphens, 3 to 63 characters. A name
// that is already valid is kept; any other gets an 8-digit hash of s.
func sanitizeContainerName(s string) string {
	var b strings.Builder
	dash := true
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' {
			b.WriteRune(r)
			dash = false
		} else if !dash {
			b.WriteByte('-')
			dash = true
		}
	}
	out := strings.TrimRight(b.String(), "-")
	if out == s && len(out) >= 3 && len(out) <= 63 {
		return out
	}
	sum := sha256.Sum256([]byte(s))
	h := hex.EncodeToString(sum[:4])
	if len(out) > 63-9 {
		out = strings.TrimRight(out[:63-9], "-")
	}
	if out == "" {
		return "vol-" + h
	}
	return out + "-" + h
}

// mountSettings are the per-volume settings from mount options.
type mountSettings struct {
	mountopt.Settings
	// Options is the canonical form, "name=value", sorted: what the node
	// state records.
	Options []string
}

// defaultMountSettings: pods run with any uid, so CSI mounts let every
// user in (allow-other) and show blobs that carry no attributes of their
// own as rwx to all (umask 0), unless the volume's mount options say
// otherwise. New entries get the mode their creator asked for. The rest
// are fusefs's defaults, which are blobfs mount's.
func defaultMountSettings() mountSettings {
	return mountSettings{Settings: mountopt.Settings{
		FS:    fusefs.Options{Umask: 0},
		Mount: kernel.MountOptions{AllowOther: true},
	}}
}

// parseMountOptions applies mount options (PV mountOptions, the
// mountOptions parameter): the options of the table (mountopt.Table) that
// CSI volumes may set, under their names and aliases, and the ones that
// change nothing (unchangingMountOptions). Forms: "name=value",
// "--name=value", "name" for true, "-o a,b", several separated by
// spaces; "_" stands for "-". Errors name the option.
func parseMountOptions(opts []string, field string) (mountSettings, error) {
	s := defaultMountSettings()
	set := map[string]string{}
	for _, o := range splitMountOptions(opts) {
		name, raw, hasVal := strings.Cut(strings.TrimLeft(o, "-"), "=")
		name = strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "_", "-")
		raw = strings.TrimSpace(raw)
		bad := func(why string) error {
			return fmt.Errorf("%s: mount option %q: %s", field, clip(o, 80), why)
		}
		if check, ok := unchangingMountOptions[name]; ok {
			if err := check(raw, hasVal); err != nil {
				return s, bad(err.Error())
			}
			continue
		}
		opt := mountopt.Lookup(name)
		if opt == nil || !opt.CSI {
			return s, bad(fmt.Sprintf("not supported (supported: %s; of blobfuse's: %s)", strings.Join(csiMountOptionNames(), ", "), strings.Join(blobfuseMountOptions, ", ")))
		}
		if !hasVal && opt.Kind == mountopt.Bool {
			raw = "true"
		}
		v, err := opt.Parse(raw)
		if err == nil {
			err = opt.Check(v)
		}
		if err != nil {
			return s, bad(err.Error())
		}
		opt.Apply(&s.Settings, v)
		set[opt.Name] = raw
	}
	cache, read := s.FS.BlockCacheBytes, s.FS.ReadBlockSize
	if cache == 0 {
		cache = fusefs.DefaultBlockCacheBytes
	}
	if read == 0 {
		read = fusefs.DefaultReadBlockSize
	}
	if cache < 2*read {
		return s, fmt.Errorf("%s: block-cache-mb %d must hold at least two read blocks of read-block-mb %d, so %d or more", field, cache>>20, read>>20, 2*read>>20)
	}
	for k, v := range set {
		s.Options = append(s.Options, k+"="+v)
	}
	slices.Sort(s.Options)
	return s, nil
}

// csiMountOptionNames are the names CSI volumes may use, for errors: the
// table's options CSI volumes may set, then their aliases.
func csiMountOptionNames() []string {
	var names, aliases []string
	for _, o := range mountopt.Table {
		if o.CSI {
			names = append(names, o.Name)
			aliases = append(aliases, o.Aliases...)
		}
	}
	return append(names, aliases...)
}

// splitMountOptions flattens mount options into single options. They may
// come space-separated in one string, as blob-csi-driver's mountOptions
// volume attribute has them ("-o allow_other
// --file-cache-timeout-in-seconds=120"); "-o" only introduces a list.
func splitMountOptions(opts []string) []string {
	var flat []string
	for _, o := range opts {
		for _, tok := range strings.Fields(o) {
			if tok == "-o" {
				continue
			}
			for _, x := range strings.Split(tok, ",") {
				if x = strings.TrimSpace(x); x != "" {
					flat = append(flat, x)
				}
			}
		}
	}
	return flat
}

// blobfuseMountOptions are the blobfuse options of blob-csi-driver's
// examples that blobfs takes besides its own (allow_other, ro, uid, gid,
// umask, attr_timeout, entry_timeout, negative_timeout in seconds): they
// ask for nothing blobfs does differently, so they change nothing.
var blobfuseMountOptions = []string{
	"file-cache-timeout-in-seconds", "file-cache-timeout", "cancel-list-on-mount-seconds",
	"cache-size-mb", "use-attr-cache", "log-level", "tmp-path", "virtual-directory=true", "use-adls=false",
}

// unchangingMountOptions are accepted and change nothing: mount(8)'s rw
// and defaults, and blobfuse's options of blob-csi-driver's examples
// (blobfuseMountOptions), whose values are checked. Neither is recorded.
var unchangingMountOptions = map[string]func(raw string, given bool) error{
	"rw":       func(string, bool) error { return nil },
	"defaults": func(string, bool) error { return nil },
	// blobfuse's whole-file cache and its listing at mount: blobfs keeps
	// no file cache (it reads blocks on demand) and lists nothing at
	// mount.
	"file-cache-timeout-in-seconds": wholeNumber,
	"file-cache-timeout":            wholeNumber,
	"cancel-list-on-mount-seconds":  wholeNumber,
	"cache-size-mb":                 wholeNumber,
	// blobfs caches attributes for attr-timeout.
	"use-attr-cache": func(raw string, given bool) error {
		_, err := blobfuseBool(raw, given)
		return err
	},
	// The driver owns logging and the cache directory.
	"log-level": func(string, bool) error { return nil },
	"tmp-path":  func(string, bool) error { return nil },
	// blobfs's directories are blob name prefixes (and marker blobs), as
	// blobfuse's virtual directories.
	"virtual-directory": func(raw string, given bool) error {
		if on, err := blobfuseBool(raw, given); err != nil || !on {
			return errors.New("blobfs always has virtual directories (true)")
		}
		return nil
	},
	"use-adls": func(raw string, given bool) error {
		if on, err := blobfuseBool(raw, given); err != nil || on {
			return errors.New(whyHNS)
		}
		return nil
	},
}

// wholeNumber checks a blobfuse option that takes seconds or MiB.
func wholeNumber(raw string, given bool) error {
	if _, err := strconv.ParseUint(raw, 10, 63); !given || err != nil {
		return errors.New("needs a whole number")
	}
	return nil
}

// blobfuseBool is a boolean option's value; the name alone is true.
func blobfuseBool(raw string, given bool) (bool, error) {
	if !given {
		return true, nil
	}
	b, err := strconv.ParseBool(raw)
	if err != nil {
		return false, errors.New("not true or false")
	}
	return b, nil
}

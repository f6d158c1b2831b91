package csi

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
	"github.com/blobfs/blobfs/fusefs/kernel"
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
	MountOptions        []string
	RetainContainer     bool
	AuthType            string
	IdentityClientID    string
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
	FS    fusefs.Options
	Mount kernel.MountOptions
	Retry blobstore.RetryPolicy
	// Options is the canonical form, "name=value", sorted: what the node
	// state records.
	Options []string
}

// mountOptionNames is the allow-list: the `blobfs mount` flags that make
// sense for one volume (not the store, the cache directory or logging,
// which the driver owns), and the aliases mount(8) users know.
var mountOptionNames = []string{
	"block-cache-mb", "read-block-mb", "readahead-blocks", "prefetch-files", "walk-ahead",
	"upload-block-mb", "upload-concurrency", "attr-timeout", "entry-timeout", "negative-timeout",
	"list-timeout", "read-only", "allow-other", "uid", "gid", "umask",
	"fuse-readers", "retry-attempts", "retry-max-delay", "debug-fuse",
	"file-mode", "dir-mode", "posix-attrs", "write-back", "write-back-mb", "verify-md5",
}

// blobfuseMountOptions are the blobfuse options of blob-csi-driver's
// examples that blobfs takes besides its own (allow_other, ro, uid, gid,
// umask, attr_timeout, entry_timeout, negative_timeout in seconds): they
// ask for nothing blobfs does differently, so they change nothing.
var blobfuseMountOptions = []string{
	"file-cache-timeout-in-seconds", "file-cache-timeout", "cancel-list-on-mount-seconds",
	"cache-size-mb", "use-attr-cache", "log-level", "tmp-path", "virtual-directory=true", "use-adls=false",
}

// defaultMountSettings: pods run with any uid, so CSI mounts let every
// user in (allow-other) and show blobs that carry no attributes of their
// own as rwx to all (umask 0), unless the volume's mount options say
// otherwise. New entries get the mode their creator asked for.
func defaultMountSettings() mountSettings {
	return mountSettings{
		FS:    fusefs.Options{Umask: 0},
		Mount: kernel.MountOptions{AllowOther: true},
	}
}

// parseMountOptions applies mount options (PV mountOptions, the
// mountOptions parameter) through the allow-list (mountOptionTable).
// Forms: "name=value", "--name=value", "name" for true, "-o a,b", several
// separated by spaces. Errors name the option.
func parseMountOptions(opts []string, field string) (mountSettings, error) {
	s := defaultMountSettings()
	set := map[string]string{}
	for _, o := range splitMountOptions(opts) {
		name, val, hasVal := strings.Cut(strings.TrimLeft(o, "-"), "=")
		name = strings.ReplaceAll(strings.ToLower(strings.TrimSpace(name)), "_", "-")
		v := optionValue{raw: strings.TrimSpace(val), given: hasVal, option: o, field: field}
		opt, ok := mountOptionByName[name]
		if !ok {
			return s, v.bad(fmt.Sprintf("not supported (supported: %s, ro; of blobfuse's: %s)", strings.Join(mountOptionNames, ", "), strings.Join(blobfuseMountOptions, ", ")))
		}
		if err := opt.apply(&s, name, v); err != nil {
			return s, err
		}
		if opt.unrecorded {
			continue
		}
		if opt.recordAs != "" {
			name = opt.recordAs
		}
		if hasVal {
			set[name] = v.raw
		} else {
			set[name] = "true"
		}
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

// optionValue is one mount option's value as given.
type optionValue struct {
	raw    string
	given  bool   // "name=value" rather than "name"
	option string // the option as written, for errors
	field  string // where it came from, for errors
}

func (v optionValue) bad(why string) error {
	return fmt.Errorf("%s: mount option %q: %s", v.field, clip(v.option, 80), why)
}

func (v optionValue) boolean() (bool, error) {
	if !v.given {
		return true, nil
	}
	b, err := strconv.ParseBool(v.raw)
	if err != nil {
		return false, v.bad("not true or false")
	}
	return b, nil
}

func (v optionValue) integer(lo, hi int64) (int64, error) {
	n, err := strconv.ParseInt(v.raw, 10, 64)
	if !v.given || err != nil || n < lo || n > hi {
		return 0, v.bad(fmt.Sprintf("needs an integer in [%d, %d]", lo, hi))
	}
	return n, nil
}

// duration takes Go's form or whole seconds, as FUSE's attr_timeout=120
// and blobfuse's.
func (v optionValue) duration() (time.Duration, error) {
	d, err := time.ParseDuration(v.raw)
	if n, nerr := strconv.ParseUint(v.raw, 10, 32); nerr == nil {
		d, err = time.Duration(n)*time.Second, nil
	}
	if !v.given || err != nil || d < 0 || d > 24*time.Hour {
		return 0, v.bad("needs a duration like 1s, 500ms or 120 (seconds); 0 disables")
	}
	return d, nil
}

func (v optionValue) mode(max uint64, example string) (uint32, error) {
	n, err := strconv.ParseUint(v.raw, 8, 32)
	if !v.given || err != nil || n > max {
		return 0, v.bad(fmt.Sprintf("needs an octal mode within %#o, e.g. %s", max, example))
	}
	return uint32(n), nil
}

// mountOption is one row of the allow-list: the names it goes by, and
// what its value does to the settings (name is the one used).
type mountOption struct {
	names []string
	apply func(s *mountSettings, name string, v optionValue) error
	// recordAs is the name the node state records it under ("" for the
	// name used); unrecorded options change nothing (the default, or
	// blobfuse's, accepted for moving over).
	recordAs   string
	unrecorded bool
}

// Rows of the table, by kind of value.

func boolOption(set func(*mountSettings, bool), names ...string) mountOption {
	return mountOption{names: names, apply: func(s *mountSettings, _ string, v optionValue) error {
		b, err := v.boolean()
		set(s, b)
		return err
	}}
}

func intOption(lo, hi int64, set func(*mountSettings, int64), names ...string) mountOption {
	return mountOption{names: names, apply: func(s *mountSettings, _ string, v optionValue) error {
		n, err := v.integer(lo, hi)
		set(s, n)
		return err
	}}
}

// timeoutOption: 0 disables, as for `blobfs mount`.
func timeoutOption(set func(*mountSettings, time.Duration), names ...string) mountOption {
	return mountOption{names: names, apply: func(s *mountSettings, _ string, v optionValue) error {
		d, err := v.duration()
		if d == 0 {
			d = -1
		}
		set(s, d)
		return err
	}}
}

// acceptedOption is an option of blobfuse's that asks for nothing blobfs
// does differently: its value is checked, and it changes nothing.
func acceptedOption(check func(v optionValue) error, names ...string) mountOption {
	return mountOption{names: names, unrecorded: true, apply: func(_ *mountSettings, _ string, v optionValue) error {
		return check(v)
	}}
}

// mountOptionTable is the allow-list: the `blobfs mount` flags that make
// sense for one volume (mountOptionNames), their aliases, and blobfuse's
// options of blob-csi-driver's examples (blobfuseMountOptions).
var mountOptionTable = []mountOption{
	{names: []string{"ro", "read-only"}, recordAs: "read-only", apply: func(s *mountSettings, _ string, v optionValue) error {
		b, err := v.boolean()
		s.FS.ReadOnly, s.Mount.ReadOnly = b, b
		return err
	}},
	{names: []string{"rw", "defaults"}, unrecorded: true, apply: func(*mountSettings, string, optionValue) error { return nil }},
	boolOption(func(s *mountSettings, b bool) { s.Mount.AllowOther = b }, "allow-other"),
	boolOption(func(s *mountSettings, b bool) { s.Mount.Debug = b }, "debug-fuse"),
	intOption(8, 64<<10, func(s *mountSettings, n int64) { s.FS.BlockCacheBytes = n << 20 }, "block-cache-mb"),
	intOption(1, 256, func(s *mountSettings, n int64) { s.FS.ReadBlockSize = n << 20 }, "read-block-mb"),
	intOption(1, 4000, func(s *mountSettings, n int64) { s.FS.UploadBlockSize = n << 20 }, "upload-block-mb"),
	intOption(1, 1024, func(s *mountSettings, n int64) { s.FS.MaxReadAheadBlocks = int(n) }, "readahead-blocks"),
	intOption(1, 256, func(s *mountSettings, n int64) { s.FS.UploadConcurrency = int(n) }, "upload-concurrency"),
	intOption(0, 1024, func(s *mountSettings, n int64) { s.FS.PrefetchFiles = zeroDisables(n) }, "prefetch-files"),
	intOption(0, 10_000_000, func(s *mountSettings, n int64) { s.FS.WalkAhead = zeroDisables(n) }, "walk-ahead"),
	boolOption(func(s *mountSettings, b bool) { s.FS.WriteBack = b }, "write-back"),
	// validate-md5: blobfuse2's name for the same check.
	boolOption(func(s *mountSettings, b bool) { s.FS.NoContentCheck = !b }, "verify-md5", "validate-md5"),
	intOption(1, 1<<30, func(s *mountSettings, n int64) { s.FS.WriteBackBytes = n << 20 }, "write-back-mb"),
	intOption(1, 64, func(s *mountSettings, n int64) { s.Mount.Readers = int(n) }, "fuse-readers"),
	intOption(1, 100, func(s *mountSettings, n int64) { s.Retry.MaxAttempts = int(n) }, "retry-attempts"),
	// Given, uid and gid are the owner of every file, as for blobfs mount.
	intOption(0, 1<<32-2, func(s *mountSettings, n int64) { s.FS.UID, s.FS.ForceOwner = uint32(n), true }, "uid"),
	intOption(0, 1<<32-2, func(s *mountSettings, n int64) { s.FS.GID, s.FS.ForceOwner = uint32(n), true }, "gid"),
	{names: []string{"file-mode", "dir-mode"}, apply: func(s *mountSettings, name string, v optionValue) error {
		m, err := v.mode(0o7777, "0750")
		if name == "file-mode" {
			s.FS.FileMode = m
		} else {
			s.FS.DirMode = m
		}
		s.FS.ForcePerm = true
		return err
	}},
	boolOption(func(s *mountSettings, b bool) { s.FS.NoAttrWrites = !b }, "posix-attrs"),
	{names: []string{"umask"}, apply: func(s *mountSettings, _ string, v optionValue) error {
		m, err := v.mode(0o777, "022")
		s.FS.Umask = m
		return err
	}},
	timeoutOption(func(s *mountSettings, d time.Duration) { s.FS.AttrTimeout = d }, "attr-timeout"),
	timeoutOption(func(s *mountSettings, d time.Duration) { s.FS.EntryTimeout = d }, "entry-timeout"),
	timeoutOption(func(s *mountSettings, d time.Duration) { s.FS.NegativeTimeout = d }, "negative-timeout"),
	timeoutOption(func(s *mountSettings, d time.Duration) { s.FS.ListTimeout = d }, "list-timeout"),
	{names: []string{"retry-max-delay"}, apply: func(s *mountSettings, _ string, v optionValue) error {
		var err error
		s.Retry.MaxDelay, err = v.duration()
		return err
	}},
	// blobfuse's whole-file cache and its listing at mount: blobfs keeps
	// no file cache (it reads blocks on demand) and lists nothing at
	// mount.
	acceptedOption(func(v optionValue) error {
		if _, err := strconv.ParseUint(v.raw, 10, 63); !v.given || err != nil {
			return v.bad("needs a whole number")
		}
		return nil
	}, "file-cache-timeout-in-seconds", "file-cache-timeout", "cancel-list-on-mount-seconds", "cache-size-mb"),
	// blobfs caches attributes for attr-timeout.
	acceptedOption(func(v optionValue) error {
		_, err := v.boolean()
		return err
	}, "use-attr-cache"),
	// The driver owns logging and the cache directory.
	acceptedOption(func(optionValue) error { return nil }, "log-level", "tmp-path"),
	// blobfs's directories are blob name prefixes (and marker blobs), as
	// blobfuse's virtual directories.
	acceptedOption(func(v optionValue) error {
		if on, err := v.boolean(); err != nil || !on {
			return v.bad("blobfs always has virtual directories (true)")
		}
		return nil
	}, "virtual-directory"),
	acceptedOption(func(v optionValue) error {
		if on, err := v.boolean(); err != nil || on {
			return v.bad(whyHNS)
		}
		return nil
	}, "use-adls"),
}

// mountOptionByName indexes mountOptionTable by every name.
var mountOptionByName = func() map[string]*mountOption {
	m := map[string]*mountOption{}
	for i := range mountOptionTable {
		for _, n := range mountOptionTable[i].names {
			if m[n] != nil {
				panic("mount option " + n + " defined twice")
			}
			m[n] = &mountOptionTable[i]
		}
	}
	return m
}()

// zeroDisables: 0 disables a count, as for blobfs mount (-1 in
// fusefs.Options).
func zeroDisables(n int64) int {
	if n == 0 {
		return -1
	}
	return int(n)
}

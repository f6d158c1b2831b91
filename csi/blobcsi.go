package csi

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Moving over from the Azure Blob CSI driver (kubernetes-sigs/blob-csi-driver).
//
// Its StorageClass parameters, volume attributes, secret keys, volume
// handles and the blobfuse mount options of its examples are accepted, so
// that its StorageClasses, PersistentVolumes and inline volumes work once
// the driver name is changed. Its names fall in four groups (the table of
// "Moving over from blob-csi-driver" in docs/kubernetes.md lists them, and
// a test keeps the two in step):
//
//   - the same thing in blobfs (storageAccount, containerName, server,
//     storageEndpointSuffix, protocol fuse/fuse2, secretName, mountOptions,
//     ...; params.go): the same result;
//   - settings of the storage account that blob-csi-driver creates, or
//     searches a resource group for, when no account is named (skuName,
//     location, resourceGroup, tags, ...): blobfs creates no accounts, so
//     they change nothing once a volume names an existing account (which is
//     also when blob-csi-driver does not use them), and they are refused,
//     named, when none is named;
//   - how blob-csi-driver fetches account keys and creates containers
//     (storeAccountKey, getLatestAccountKey, useDataPlaneAPI, ...) and
//     settings of its NFS mounts (mountPermissions): accepted, and nothing
//     changes; blobfs uses the credentials it is given and the Blob API;
//   - what blobfs does not do (NFS, Key Vault, service principal secrets,
//     per-pod workload identity tokens, Data Lake accounts): refused with a
//     message that names the parameter and says what to use instead.
//
// Volume handles: blob-csi-driver's RG#ACCOUNT#CONTAINER[#UUID[#NAMESPACE
// [#SUBSCRIPTION]]] names the container (parseBlobCSIHandle); with no
// credentials given, the node then reads the Secret blob-csi-driver stores
// keys in, azure-storage-account-ACCOUNT-secret, before it falls back to
// its own identity, as blob-csi-driver falls back to its cluster identity.

// compatParam is one of blob-csi-driver's parameter or volume attribute
// names that is not a blobfs parameter of its own.
type compatParam struct {
	name string // as blob-csi-driver's documentation spells it
	// accountSetting: it sets up a storage account that blob-csi-driver
	// would create or pick. Accepted when the volume names an existing
	// account, refused when none is named.
	accountSetting bool
	// check validates the value; its error refuses the volume and says
	// why and what to do instead. nil accepts any value.
	check func(v string) error
}

// Why the things blobfs does not do are refused; each names what to use.
const (
	whyHNS         = "blobfs does not create Data Lake (hierarchical namespace) accounts and mounts through the Blob API only, without blobfuse's --use-adls; leave it out to mount the container through the Blob API"
	whyIdentityID  = "blobfs picks a user-assigned managed identity by its client id only; use AzureStorageIdentityClientID"
	whyMSIEndpoint = "blobfs gets managed identity tokens from the node's own identity endpoint, not a per-volume one; leave it out"
	whySPN         = "blobfs does not sign in as a service principal given per volume; use an account key or SAS token in a Secret, or the driver's Azure AD identity (workload or managed identity; AzureStorageIdentityClientID picks a user-assigned one)"
	whyAADEndpoint = "blobfs takes the Azure AD authority from the driver's environment (AZURE_AUTHORITY_HOST), not per volume; leave it out"
	whyPodIdentity = "blobfs does not mount with the pod's service account token; it uses a Secret or the driver's own Azure AD identity (give it Storage Blob Data Contributor; AzureStorageIdentityClientID picks a user-assigned one)"
)

var compatParams = []compatParam{
	// Settings of a storage account that blob-csi-driver creates or picks.
	{name: "skuName", accountSetting: true},
	{name: "storageAccountType", accountSetting: true},
	{name: "location", accountSetting: true},
	{name: "resourceGroup", accountSetting: true},
	{name: "subscriptionID", accountSetting: true},
	{name: "accessTier", accountSetting: true},
	{name: "allowBlobPublicAccess", accountSetting: true, check: isBool},
	{name: "allowSharedKeyAccess", accountSetting: true, check: isBool},
	{name: "requireInfraEncryption", accountSetting: true, check: isBool},
	{name: "publicNetworkAccess", accountSetting: true},
	{name: "networkEndpointType", accountSetting: true},
	{name: "vnetResourceGroup", accountSetting: true},
	{name: "vnetName", accountSetting: true},
	{name: "vnetLinkName", accountSetting: true},
	{name: "subnetName", accountSetting: true},
	{name: "tags", accountSetting: true},
	{name: "matchTags", accountSetting: true, check: isBool},
	{name: "softDeleteBlobs", accountSetting: true, check: isDays},
	{name: "softDeleteContainers", accountSetting: true, check: isDays},
	{name: "enableBlobVersioning", accountSetting: true, check: isBool},
	{name: "isHnsEnabled", accountSetting: true, check: falseOnly(whyHNS)},

	// How blob-csi-driver gets keys and creates containers, and its NFS
	// mounts' root permissions (its blobfuse mounts ignore them too).
	{name: "storeAccountKey", check: isBool},
	{name: "getLatestAccountKey", check: isBool},
	{name: "getAccountKeyFromSecret", check: isBool},
	{name: "useDataPlaneAPI", check: isBool},
	{name: "mountPermissions", check: isOctalMode},

	// What blobfs does not do.
	{name: "AzureStorageIdentityObjectID", check: emptyOnly(whyIdentityID)},
	{name: "AzureStorageIdentityResourceID", check: emptyOnly(whyIdentityID)},
	{name: "MSIEndpoint", check: emptyOnly(whyMSIEndpoint)},
	{name: "AzureStorageSPNClientID", check: emptyOnly(whySPN)},
	{name: "AzureStorageSPNTenantID", check: emptyOnly(whySPN)},
	{name: "AzureStorageAADEndpoint", check: emptyOnly(whyAADEndpoint)},
	{name: "clientID", check: emptyOnly(whyPodIdentity)},
	{name: "mountWithWorkloadIdentityToken", check: falseOnly(whyPodIdentity)},
	{name: "tenantID"}, // used only with clientID
}

// refusedSecretKeys are blob-csi-driver's secret keys for what blobfs does
// not do, and why.
var refusedSecretKeys = map[string]string{
	"azurestoragespnclientsecret": whySPN,
	"azurestoragespnclientid":     whySPN,
	"azurestoragespntenantid":     whySPN,
}

var compatByName = func() map[string]compatParam {
	m := make(map[string]compatParam, len(compatParams))
	for _, c := range compatParams {
		m[strings.ToLower(c.name)] = c
	}
	return m
}()

// compatParamNamed looks up a lower-case name.
func compatParamNamed(lower string) (compatParam, bool) {
	c, ok := compatByName[lower]
	return c, ok
}

func compatParamNames() []string {
	out := make([]string, len(compatParams))
	for i, c := range compatParams {
		out[i] = c.name
	}
	return out
}

// checkProtocol accepts blob-csi-driver's FUSE protocols, which blobfs
// serves with its own FUSE filesystem, and refuses NFS.
func checkProtocol(v string) error {
	switch strings.ToLower(v) {
	case "", "fuse", "fuse2", "blobfuse", "blobfuse2":
		return nil
	case "nfs", "aznfs", "nfsv3":
		return errors.New("blobfs mounts containers with FUSE through the Blob API; NFSv3 is not supported: use protocol fuse (or fuse2), or blob-csi-driver for NFS volumes")
	}
	return errors.New("not a protocol blobfs serves: use fuse (fuse2, blobfuse and blobfuse2 mean the same)")
}

func isBool(v string) error {
	if v == "" {
		return nil
	}
	if _, err := strconv.ParseBool(v); err != nil {
		return errors.New("not true or false")
	}
	return nil
}

func isDays(v string) error {
	if v == "" {
		return nil
	}
	if n, err := strconv.Atoi(v); err != nil || n < 0 || n > 365 {
		return errors.New("not a number of days (0 to 365)")
	}
	return nil
}

func isOctalMode(v string) error {
	if v == "" {
		return nil
	}
	if n, err := strconv.ParseUint(v, 8, 32); err != nil || n > 0o7777 {
		return errors.New("not an octal mode like 0777")
	}
	return nil
}

// falseOnly accepts false (and nothing); true is refused, saying why.
func falseOnly(why string) func(string) error {
	return func(v string) error {
		if err := isBool(v); err != nil {
			return err
		}
		if b, _ := strconv.ParseBool(v); b {
			return errors.New(why)
		}
		return nil
	}
}

// emptyOnly accepts an empty value (blob-csi-driver's default) only.
func emptyOnly(why string) func(string) error {
	return func(v string) error {
		if v != "" {
			return errors.New(why)
		}
		return nil
	}
}

// validEndpointSuffix accepts a DNS suffix such as core.windows.net or
// core.chinacloudapi.cn (storageEndpointSuffix).
func validEndpointSuffix(s string) bool {
	s = strings.Trim(strings.ToLower(s), ".")
	if s == "" || len(s) > 200 || !strings.Contains(s, ".") {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-') {
			return false
		}
	}
	return !strings.Contains(s, "..")
}

// blobCSISecretName is the Secret blob-csi-driver stores an account's key
// in (storeAccountKey, its default) and reads at NodeStageVolume when a
// volume comes with no credentials.
func blobCSISecretName(account string) string {
	return fmt.Sprintf("azure-storage-account-%s-secret", account)
}

// closestName returns the known name nearest to k (case-insensitive
// edit distance at most 2, or 3 for long names), or "".
func closestName(k string, known []string) string {
	k = strings.ToLower(k)
	best, bestD := "", 3
	if len(k) >= 12 {
		bestD = 4
	}
	for _, n := range known {
		if d := editDistance(k, strings.ToLower(n)); d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b (bytes).
func editDistance(a, b string) int {
	if len(a) > 100 || len(b) > 100 {
		return 100
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

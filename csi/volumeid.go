package csi

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/blobfs/blobfs/blobstore"
)

// Volume ids.
//
// A volume id names the container of a volume so that the node (and
// DeleteVolume, which gets nothing but the id) can find it again:
//
//	blobfs1#ACCOUNT#CONTAINER[#ENDPOINT[#FLAGS]]
//
// ACCOUNT is the storage account, CONTAINER the container. ENDPOINT is the
// blob service URL; it is left out (or empty) when it is the default
// https://ACCOUNT.blob.core.windows.net/. FLAGS is a comma-separated list;
// the one flag defined is "retain": DeleteVolume keeps the container (the
// StorageClass parameter retainContainer=true). '#' cannot occur in any
// field: account and container names are [a-z0-9-] and an endpoint may not
// carry a fragment. Examples:
//
//	blobfs1#myaccount#pvc-data
//	blobfs1#devstoreaccount1#pvc-data#http://127.0.0.1:10000/devstoreaccount1
//	blobfs1#myaccount#shared##retain
const volumeIDPrefix = "blobfs1"

// flagRetain in a volume id keeps the container on DeleteVolume.
const flagRetain = "retain"

// volumeID is a parsed volume id.
type volumeID struct {
	Account   string
	Container string
	Endpoint  string // "" means the account's default endpoint
	Retain    bool
}

// String formats the id; parseVolumeID(id.String()) == id.
func (v volumeID) String() string {
	s := volumeIDPrefix + "#" + v.Account + "#" + v.Container
	switch {
	case v.Retain:
		s += "#" + v.Endpoint + "#" + flagRetain
	case v.Endpoint != "":
		s += "#" + v.Endpoint
	}
	return s
}

// errMalformedID is wrapped by every parse failure.
var errMalformedID = errors.New("malformed volume id")

// parseVolumeID parses and checks an id. Its errors say what is wrong and
// what the format is; they wrap errMalformedID.
func parseVolumeID(s string) (volumeID, error) {
	bad := func(why string) (volumeID, error) {
		return volumeID{}, fmt.Errorf("%w %q: %s (expected %s#ACCOUNT#CONTAINER[#ENDPOINT[#FLAGS]])", errMalformedID, clip(s, 200), why, volumeIDPrefix)
	}
	parts := strings.Split(s, "#")
	if parts[0] != volumeIDPrefix {
		return bad("it does not start with " + volumeIDPrefix + "#")
	}
	if len(parts) < 3 || len(parts) > 5 {
		return bad(fmt.Sprintf("it has %d '#'-separated fields", len(parts)))
	}
	v := volumeID{Account: parts[1], Container: parts[2]}
	if len(parts) > 3 {
		v.Endpoint = parts[3]
	}
	if len(parts) > 4 {
		for _, f := range strings.Split(parts[4], ",") {
			switch f {
			case flagRetain:
				v.Retain = true
			case "":
			default:
				return bad(fmt.Sprintf("unknown flag %q", f))
			}
		}
	}
	if v.Account == "" {
		return bad("the account is empty")
	}
	if err := v.check(); err != nil {
		return bad(err.Error())
	}
	return v, nil
}

// check validates the fields without network access.
func (v volumeID) check() error {
	if !validAccount(v.Account) {
		return fmt.Errorf("account %q is not a storage account name (3 to 24 lowercase letters and digits)", v.Account)
	}
	if v.Endpoint != "" {
		u, err := url.Parse(v.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
			return fmt.Errorf("endpoint %q is not an http(s) URL without query or credentials", clip(v.Endpoint, 100))
		}
	}
	// Anonymous needs no credentials: Validate checks names and URL only.
	return blobstore.AzureConfig{Account: v.Account, Container: v.Container, Endpoint: v.Endpoint, Auth: blobstore.AzureAuthAnonymous}.Validate()
}

// blobCSIHandle is a volume handle in the Azure Blob CSI driver's format,
//
//	RESOURCEGROUP#ACCOUNT#CONTAINER[#UUID[#SECRETNAMESPACE[#SUBSCRIPTION]]]
//
// which the volumes it provisions have and static PVs may use. blobfs
// reaches the account by name, so the resource group and subscription do
// not matter; SECRETNAMESPACE is where blob-csi-driver keeps the Secret
// with the account key (blobCSISecretName).
type blobCSIHandle struct {
	ResourceGroup, Account, Container, SecretNamespace, SubscriptionID string
}

// parseBlobCSIHandle parses a handle in that format. Its errors say what
// is wrong and wrap errMalformedID.
func parseBlobCSIHandle(s string) (blobCSIHandle, error) {
	bad := func(why string) (blobCSIHandle, error) {
		return blobCSIHandle{}, fmt.Errorf("%w %q: %s (expected %s#ACCOUNT#CONTAINER[#ENDPOINT[#FLAGS]], or blob-csi-driver's RESOURCEGROUP#ACCOUNT#CONTAINER[#UUID[#SECRETNAMESPACE[#SUBSCRIPTION]]]; or give volume_context containerName)",
			errMalformedID, clip(s, 200), why, volumeIDPrefix)
	}
	parts := strings.Split(s, "#")
	if len(parts) < 3 || len(parts) > 6 {
		return bad(fmt.Sprintf("it has %d '#'-separated fields", len(parts)))
	}
	h := blobCSIHandle{ResourceGroup: parts[0], Account: parts[1], Container: parts[2]}
	if len(parts) > 4 {
		h.SecretNamespace = parts[4]
	}
	if len(parts) > 5 {
		h.SubscriptionID = parts[5]
	}
	if err := (volumeID{Account: h.Account, Container: h.Container}).check(); err != nil {
		return bad(err.Error())
	}
	return h, nil
}

func validAccount(s string) bool {
	if len(s) < 3 || len(s) > 24 {
		return false
	}
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

// defaultEndpoint is the blob endpoint of an account in Azure's public
// cloud, which a volume id leaves out.
func defaultEndpoint(account string) string {
	return "https://" + account + ".blob.core.windows.net/"
}

// clip shortens s for an error message.
func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

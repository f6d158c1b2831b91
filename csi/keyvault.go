package csi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"sync"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/security/keyvault/azsecrets"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
)

// KeyVault reads a secret's value from Azure Key Vault with the driver's
// own Azure AD identity. A volume whose keyVaultURL and keyVaultSecretName
// (and optionally keyVaultSecretVersion) name a secret holding its
// account key or SAS token is mounted with it, as blob-csi-driver does:
// the key then lives in Key Vault only, and the driver's identity needs
// the "Key Vault Secrets User" role on the vault, not on the account.
type KeyVault interface {
	// SecretValue returns the value of secret name of the vault at
	// vaultURL, at version ("": the current one).
	SecretValue(ctx context.Context, vaultURL, name, version string) (string, error)
}

// azureKeyVault is the default KeyVault: the azsecrets SDK, signed in with
// the driver's DefaultAzureCredential (workload identity, managed
// identity, environment), made at first use so that a driver that never
// meets a Key Vault volume never asks for one.
type azureKeyVault struct {
	opts    *azsecrets.ClientOptions
	newCred func() (azcore.TokenCredential, error)

	once sync.Once
	cred azcore.TokenCredential
	err  error
}

func newAzureKeyVault() *azureKeyVault {
	return &azureKeyVault{newCred: func() (azcore.TokenCredential, error) {
		return azidentity.NewDefaultAzureCredential(nil)
	}}
}

func (k *azureKeyVault) SecretValue(ctx context.Context, vaultURL, name, version string) (string, error) {
	k.once.Do(func() { k.cred, k.err = k.newCred() })
	if k.err != nil {
		return "", fmt.Errorf("the driver's Azure AD identity: %w", k.err)
	}
	c, err := azsecrets.NewClient(vaultURL, k.cred, k.opts)
	if err != nil {
		return "", err
	}
	resp, err := c.GetSecret(ctx, name, version, nil)
	if err != nil {
		return "", err
	}
	if resp.Value == nil || *resp.Value == "" {
		return "", errors.New("the secret has no value")
	}
	return *resp.Value, nil
}

// keyVaultSecretRE is Key Vault's rule for secret names; versions are 32
// hex digits.
var (
	keyVaultSecretRE  = regexp.MustCompile(`^[0-9A-Za-z-]{1,127}$`)
	keyVaultVersionRE = regexp.MustCompile(`^[0-9a-fA-F]{32}$`)
)

// checkKeyVault validates a volume's Key Vault parameters: an https URL of
// a vault (no path beyond "/", no query), a secret name, an optional
// version; all or none of URL and name.
func checkKeyVault(vaultURL, name, version string) error {
	switch {
	case vaultURL == "" && name == "" && version == "":
		return nil
	case vaultURL == "":
		return errors.New("keyVaultSecretName needs keyVaultURL, the vault's URL (https://NAME.vault.azure.net/)")
	case name == "":
		return errors.New("keyVaultURL needs keyVaultSecretName, the secret that holds the account key or SAS token")
	case !keyVaultSecretRE.MatchString(name):
		return fmt.Errorf("keyVaultSecretName %q: 1 to 127 letters, digits and hyphens", clip(name, 40))
	case version != "" && !keyVaultVersionRE.MatchString(version):
		return fmt.Errorf("keyVaultSecretVersion %q: 32 hexadecimal digits, or empty for the current version", clip(version, 40))
	}
	u, err := url.Parse(vaultURL)
	switch {
	case err != nil || u.Scheme != "https" || u.Host == "" || u.User != nil || u.RawQuery != "" || u.Fragment != "" || strings.Trim(u.Path, "/") != "":
		return fmt.Errorf("keyVaultURL %q: give the vault's URL, https://NAME.vault.azure.net/", clip(vaultURL, 80))
	}
	// The vault gets the driver's Azure AD token: never the metadata
	// service (blobstore's endpoint guard).
	if err := blobstore.CheckEndpoint(vaultURL); err != nil {
		return fmt.Errorf("keyVaultURL: %v", err)
	}
	return nil
}

// keyVaultSource is a volume's credential source in the node state, for
// reading them again on a repair: not secret.
func keyVaultSource(p volumeParams) string {
	return "keyvault:" + p.KeyVaultURL + "#" + p.KeyVaultSecretName + "#" + p.KeyVaultSecretVersion
}

// keyVaultCreds reads the credentials of a volume from Key Vault: the
// secret holds an account key, or a SAS token (blob-csi-driver accepts
// both).
func (d *Driver) keyVaultCreds(ctx context.Context, vaultURL, name, version string) (credentials, error) {
	v, err := d.keyVault.SecretValue(ctx, vaultURL, name, version)
	if err != nil {
		return credentials{}, keyVaultError(fmt.Sprintf("read secret %s of Key Vault %s", name, vaultURL), err)
	}
	v = strings.TrimSpace(v)
	if strings.Contains(v, "sig=") {
		return credentials{SASToken: strings.TrimPrefix(v, "?")}, nil
	}
	return credentials{Key: v}, nil
}

// credsFromKeyVault reads a recorded volume's credentials again from the
// Key Vault secret its source names.
func (d *Driver) credsFromKeyVault(ctx context.Context, src string) (credentials, error) {
	ref := strings.TrimPrefix(src, "keyvault:")
	vaultURL, rest, _ := strings.Cut(ref, "#")
	name, version, _ := strings.Cut(rest, "#")
	return d.keyVaultCreds(ctx, vaultURL, name, version)
}

// keyVaultError maps a failure to read a Key Vault secret: a secret that
// does not exist is the volume's to fix (FailedPrecondition), a refusal
// the identity's (PermissionDenied); anything else may pass (Unavailable:
// kubelet retries). The message goes through the redaction layer.
func keyVaultError(what string, err error) error {
	code := codes.Unavailable
	var re *azcore.ResponseError
	switch {
	case errors.As(err, &re) && re.StatusCode == http.StatusNotFound:
		code = codes.FailedPrecondition
	case errors.As(err, &re) && (re.StatusCode == http.StatusUnauthorized || re.StatusCode == http.StatusForbidden):
		code = codes.PermissionDenied
	case errors.Is(err, context.DeadlineExceeded):
		code = codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		code = codes.Canceled
	}
	return status.Errorf(code, "%s: %v", what, blobstore.RedactError(err))
}

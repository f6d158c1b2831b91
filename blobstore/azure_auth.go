package blobstore

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"
)

// Authentication modes of AzureConfig.Auth.
const (
	AzureAuthKey        = "key"       // shared key: Account + Key
	AzureAuthSAS        = "sas"       // SAS token appended to every URL
	AzureAuthConnString = "connstr"   // a storage connection string
	AzureAuthAnonymous  = "anonymous" // no credentials: public read access only
	// AzureAuthAzureAD uses a Microsoft Entra ID (Azure AD) token: a
	// user-assigned managed identity when ClientID is set, otherwise
	// azidentity's DefaultAzureCredential (environment service principal,
	// workload identity, managed identity, Azure CLI, ...).
	AzureAuthAzureAD = "azuread"
)

// Azurite's built-in account, used by the connection string
// "UseDevelopmentStorage=true". The key is public: Azurite ships it
// (dist/src/common/utils/constants.js, EMULATOR_ACCOUNT_KEY) and
// Microsoft documents it for the storage emulator.
const (
	AzuriteAccount    = "devstoreaccount1"
	AzuriteAccountKey = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
	azuriteEndpoint   = "http://127.0.0.1:10000/" + AzuriteAccount
)

// defaultTryTimeout bounds one HTTP try, body included, when
// AzureConfig.TryTimeout is zero. It is a hang detector, not a latency
// target: a block of tens of MiB on a slow link must still fit.
const defaultTryTimeout = 2 * time.Minute

// AzureConfig selects one container and how to authenticate to it. The zero
// value of every field means "not given"; Validate says what is missing or
// contradictory. Secrets (Key, SASToken, ConnectionString) are never printed
// by this package, neither in errors nor by String.
type AzureConfig struct {
	// Account is the storage account name. It may be left empty when
	// Endpoint or ConnectionString names the account.
	Account string
	// Container is the container's name.
	Container string
	// Endpoint is the blob service URL, https://<account>.blob.core.windows.net/
	// by default. Azurite and other path-style endpoints include the
	// account: http://127.0.0.1:10000/devstoreaccount1.
	Endpoint string
	// Key is the base64 account key (shared key authentication).
	Key string
	// SASToken is a shared access signature query string, with or without
	// the leading "?".
	SASToken string
	// ConnectionString is a storage connection string: AccountName and
	// AccountKey or SharedAccessSignature, optionally BlobEndpoint,
	// DefaultEndpointsProtocol and EndpointSuffix; or
	// "UseDevelopmentStorage=true" for a local Azurite.
	ConnectionString string
	// Anonymous asks for unauthenticated access to a public container; the
	// same as Auth "anonymous".
	Anonymous bool
	// Auth is one of the AzureAuth* modes. Empty means: the one mode whose
	// credentials are given (Key, SASToken, ConnectionString, Anonymous,
	// ClientID), and Azure AD when none is. Also accepted: "msi" and
	// "login" for azuread, "connectionstring" for connstr.
	Auth string
	// ClientID selects a user-assigned managed identity (Azure AD mode
	// only). Empty means DefaultAzureCredential, which itself reads
	// AZURE_CLIENT_ID, AZURE_TENANT_ID and friends.
	ClientID string
	// TryTimeout bounds each HTTP request, reading the response body
	// included. Zero means 2 minutes.
	TryTimeout time.Duration
}

// AzureConfigFromEnv reads the conventional environment variables of the
// Azure CLI and blobfuse2:
//
//	AZURE_STORAGE_ACCOUNT                           Account
//	AZURE_STORAGE_ACCOUNT_CONTAINER, else
//	AZURE_STORAGE_CONTAINER                         Container
//	AZURE_STORAGE_BLOB_ENDPOINT                     Endpoint
//	AZURE_STORAGE_KEY, else AZURE_STORAGE_ACCESS_KEY Key
//	AZURE_STORAGE_SAS_TOKEN                         SASToken
//	AZURE_STORAGE_CONNECTION_STRING                 ConnectionString
//	AZURE_STORAGE_AUTH_TYPE                         Auth
//	AZURE_STORAGE_IDENTITY_CLIENT_ID                ClientID
//
// AZURE_CLIENT_ID is deliberately not copied into ClientID: it is shared
// with service principals (AZURE_CLIENT_SECRET) and workload identity
// (AZURE_FEDERATED_TOKEN_FILE), and DefaultAzureCredential already reads it
// (with AZURE_TENANT_ID, AZURE_CLIENT_SECRET, AZURE_FEDERATED_TOKEN_FILE,
// AZURE_AUTHORITY_HOST, AZURE_TOKEN_CREDENTIALS) straight from the process
// environment, for a user-assigned managed identity too. Pass os.Getenv.
func AzureConfigFromEnv(getenv func(string) string) AzureConfig {
	first := func(names ...string) string {
		for _, n := range names {
			if v := strings.TrimSpace(getenv(n)); v != "" {
				return v
			}
		}
		return ""
	}
	return AzureConfig{
		Account:          first("AZURE_STORAGE_ACCOUNT"),
		Container:        first("AZURE_STORAGE_ACCOUNT_CONTAINER", "AZURE_STORAGE_CONTAINER"),
		Endpoint:         first("AZURE_STORAGE_BLOB_ENDPOINT"),
		Key:              first("AZURE_STORAGE_KEY", "AZURE_STORAGE_ACCESS_KEY"),
		SASToken:         first("AZURE_STORAGE_SAS_TOKEN"),
		ConnectionString: first("AZURE_STORAGE_CONNECTION_STRING"),
		Auth:             first("AZURE_STORAGE_AUTH_TYPE"),
		ClientID:         first("AZURE_STORAGE_IDENTITY_CLIENT_ID"),
	}
}

// String describes the configuration for logs, without secrets.
func (c AzureConfig) String() string {
	t, err := c.resolve()
	if err != nil {
		return fmt.Sprintf("azure container %q (invalid: %v)", c.Container, err)
	}
	return fmt.Sprintf("azure container %q at %s (auth %s)", c.Container, t.serviceURL, t.mode)
}

// ID names the container for records that must tell stores apart (the
// spill files of a cache directory): its URL, without credentials. It is
// empty when the configuration is invalid.
func (c AzureConfig) ID() string {
	t, err := c.resolve()
	if err != nil {
		return ""
	}
	return t.serviceURL + t.container
}

// GoString keeps %#v from printing secrets too.
func (c AzureConfig) GoString() string { return "blobstore.AzureConfig{" + c.String() + "}" }

// Validate checks the configuration without network access.
func (c AzureConfig) Validate() error {
	_, err := c.resolve()
	return err
}

// azureTarget is a validated AzureConfig: one auth mode and the material it
// needs.
type azureTarget struct {
	mode       string
	serviceURL string // scheme://host[/account]/ : no query, ends in "/"
	account    string // may be empty unless mode is key
	key        string
	sas        string // query string without "?"
	clientID   string
	container  string
	tryTimeout time.Duration
	// sasExpiry is the SAS token's signed expiry (se), zero when there
	// is no SAS or it names none that parses.
	sasExpiry time.Time
}

// containerURL is the container's URL with the SAS token, if any.
func (t azureTarget) containerURL() string {
	u := t.serviceURL + t.container
	if t.sas != "" {
		u += "?" + t.sas
	}
	return u
}

// resolve validates c. Its errors may quote what the user gave (an
// endpoint, a connection string's parts), so they are redacted here.
func (c AzureConfig) resolve() (azureTarget, error) {
	t, err := c.resolveUnredacted()
	return t, RedactError(err)
}

func (c AzureConfig) resolveUnredacted() (azureTarget, error) {
	t := azureTarget{container: c.Container, tryTimeout: c.TryTimeout, clientID: c.ClientID}
	if t.tryTimeout == 0 {
		t.tryTimeout = defaultTryTimeout
	}
	if t.tryTimeout < 0 {
		return t, fmt.Errorf("azure: TryTimeout %v is negative", c.TryTimeout)
	}
	if err := validContainerName(c.Container); err != nil {
		return t, err
	}
	mode, err := c.authMode()
	if err != nil {
		return t, err
	}
	t.mode = mode

	account, endpoint := c.Account, c.Endpoint
	switch mode {
	case AzureAuthKey:
		t.key = c.Key
	case AzureAuthSAS:
		t.sas = strings.TrimPrefix(c.SASToken, "?")
	case AzureAuthConnString:
		cs, err := parseConnectionString(c.ConnectionString)
		if err != nil {
			return t, err
		}
		if account != "" && cs.account != "" && account != cs.account {
			return t, fmt.Errorf("azure: conflicting account: Account is %q but the connection string says AccountName=%s", account, cs.account)
		}
		if endpoint != "" && cs.endpoint != "" && strings.TrimSuffix(endpoint, "/") != strings.TrimSuffix(cs.endpoint, "/") {
			return t, fmt.Errorf("azure: conflicting endpoint: Endpoint is %q but the connection string says %s", endpoint, cs.endpoint)
		}
		if cs.account != "" {
			account = cs.account
		}
		if cs.endpoint != "" {
			endpoint = cs.endpoint
		}
		t.key, t.sas = cs.key, cs.sas
	}

	if endpoint == "" {
		if account == "" {
			return t, errors.New("azure: missing account: set Account (AZURE_STORAGE_ACCOUNT) or Endpoint (AZURE_STORAGE_BLOB_ENDPOINT)")
		}
		if !validAccountName(account) {
			return t, fmt.Errorf("azure: account name %q is invalid: 3 to 24 lowercase letters and digits", account)
		}
		endpoint = "https://" + account + ".blob.core.windows.net/"
	}
	u, err := parseEndpoint(endpoint)
	if err != nil {
		return t, err
	}
	if t.sas != "" {
		t.sasExpiry = sasExpiry(t.sas)
	}
	if !strings.HasSuffix(u.Path, "/") {
		u.Path += "/"
	}
	t.serviceURL = u.String()
	if account == "" {
		account = accountFromEndpoint(u)
	}
	t.account = account

	switch mode {
	case AzureAuthKey:
		if t.account == "" {
			return t, fmt.Errorf("azure: shared key authentication needs the account name: set Account (AZURE_STORAGE_ACCOUNT)")
		}
		if _, err := base64.StdEncoding.DecodeString(t.key); err != nil || t.key == "" {
			return t, fmt.Errorf("azure: the account key is not valid base64 (copy it whole from the portal or `az storage account keys list`)")
		}
	case AzureAuthSAS:
		q, err := url.ParseQuery(t.sas)
		if err != nil || q.Get("sig") == "" {
			return t, errors.New("azure: the SAS token is malformed: expected a query string such as sv=2022-11-02&sp=rl&sig=XXXX")
		}
	case AzureAuthAzureAD:
		// azcore refuses to send a bearer token over plain HTTP.
		if u.Scheme != "https" {
			return t, fmt.Errorf("azure: Azure AD authentication needs an https endpoint, not %s", t.serviceURL)
		}
	}
	return t, nil
}

// CheckEndpoint validates a blob service endpoint (scheme://host[/account])
// without network access, as AzureConfig.Validate does: a caller that
// takes an endpoint apart from the rest of a configuration (a CSI volume
// parameter) can refuse it where it is given. Its errors may quote the
// endpoint.
func CheckEndpoint(endpoint string) error {
	_, err := parseEndpoint(endpoint)
	return RedactError(err)
}

// parseEndpoint parses and checks a blob service endpoint: http or https,
// a host, no user information, query or fragment, and no path segment
// that changes which URL it names. A "." or ".." segment (also
// percent-encoded), or an empty one from "//", would be resolved by a
// proxy or by the service, not by blobfs, and the account it reaches
// would not be the one the endpoint seems to name; the container and
// blob names are appended to the path too.
func parseEndpoint(endpoint string) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	switch {
	case err != nil:
		return nil, fmt.Errorf("azure: endpoint %q is not a URL: %v", endpoint, err)
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("azure: endpoint %q must start with https:// (or http:// for a local emulator)", endpoint)
	case u.Host == "":
		return nil, fmt.Errorf("azure: endpoint %q has no host", endpoint)
	case u.User != nil:
		return nil, fmt.Errorf("azure: endpoint %q must not contain user information", u.Redacted())
	case u.RawQuery != "" || u.Fragment != "" || u.ForceQuery:
		// A pasted SAS URL: refuse rather than guess, and do not echo it.
		return nil, fmt.Errorf("azure: endpoint %s://%s%s must not carry a query or fragment; pass a SAS token in AZURE_STORAGE_SAS_TOKEN", u.Scheme, u.Host, u.Path)
	}
	if err := checkHostAddr(u.Hostname()); err != nil {
		return nil, fmt.Errorf("azure: endpoint %s://%s: %w", u.Scheme, u.Host, err)
	}
	// u.Path is decoded: %2e%2e is "..", %2f a separator.
	segs := strings.Split(strings.TrimSuffix(strings.TrimPrefix(u.Path, "/"), "/"), "/")
	for _, seg := range segs {
		if seg == "." || seg == ".." || seg == "" && u.Path != "" && u.Path != "/" {
			return nil, fmt.Errorf("azure: endpoint %q has a path segment %q, which changes the URL it names; give it as scheme://host/ or scheme://host/ACCOUNT/", endpoint, seg)
		}
	}
	return u, nil
}

// sasExpiry reads a SAS token's signed expiry (se): a UTC time in one of
// the ISO 8601 forms the service accepts. Zero if it has none or it does
// not parse.
func sasExpiry(token string) time.Time {
	q, err := url.ParseQuery(token)
	if err != nil {
		return time.Time{}
	}
	se := q.Get("se")
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04Z07:00", "2006-01-02"} {
		if t, err := time.Parse(layout, se); err == nil {
			return t.UTC()
		}
	}
	return time.Time{}
}

// SASExpiry returns when the configuration's SAS token (SASToken, or the
// SharedAccessSignature of ConnectionString) expires; ok is false when
// there is none, or it carries no expiry that parses.
func (c AzureConfig) SASExpiry() (expiry time.Time, ok bool) {
	t, err := c.resolve()
	if err != nil || t.sasExpiry.IsZero() {
		return time.Time{}, false
	}
	return t.sasExpiry, true
}

// SASExpiryWarning is how long before its SAS token expires a mount warns
// of it (WarnSASExpiry).
const SASExpiryWarning = 24 * time.Hour

// WarnSASExpiry logs a warning on log if cfg's SAS token has expired or
// expires within SASExpiryWarning of now: once it has, every request
// fails with ErrUnauthorized. The token itself is not logged.
func WarnSASExpiry(log *slog.Logger, cfg AzureConfig, now time.Time) {
	exp, ok := cfg.SASExpiry()
	switch {
	case !ok || exp.Sub(now) > SASExpiryWarning:
	case !exp.After(now):
		log.Warn("the SAS token has expired: every request will be refused (HTTP 403) until it is replaced",
			"expired", exp.Format(time.RFC3339), "container", cfg.Container)
	default:
		log.Warn("the SAS token expires soon: from then on every request will be refused (HTTP 403) until it is replaced",
			"expires", exp.Format(time.RFC3339), "in", exp.Sub(now).Round(time.Minute), "container", cfg.Container)
	}
}

// authMode picks the authentication mode: Auth when set (checking that its
// credentials are present), else the only one whose credentials are given.
func (c AzureConfig) authMode() (string, error) {
	given := []struct {
		mode, what string
		set        bool
	}{
		{AzureAuthKey, "an account key (AZURE_STORAGE_KEY)", c.Key != ""},
		{AzureAuthSAS, "a SAS token (AZURE_STORAGE_SAS_TOKEN)", c.SASToken != ""},
		{AzureAuthConnString, "a connection string (AZURE_STORAGE_CONNECTION_STRING)", c.ConnectionString != ""},
		{AzureAuthAnonymous, "anonymous access", c.Anonymous},
		{AzureAuthAzureAD, "a managed identity client id (--identity-client-id, AZURE_STORAGE_IDENTITY_CLIENT_ID)", c.ClientID != ""},
	}
	mode := strings.ToLower(strings.TrimSpace(c.Auth))
	switch mode {
	case "":
		var set []string
		for _, g := range given {
			if g.set {
				if mode == "" {
					mode = g.mode
				}
				set = append(set, g.what)
			}
		}
		if len(set) > 1 {
			return "", fmt.Errorf("azure: conflicting credentials: %s; choose one with --auth-type (AZURE_STORAGE_AUTH_TYPE)", strings.Join(set, " and "))
		}
		if mode == "" {
			mode = AzureAuthAzureAD
		}
		return mode, nil
	case "msi", "login":
		mode = AzureAuthAzureAD
	case "connectionstring":
		mode = AzureAuthConnString
	case AzureAuthKey, AzureAuthSAS, AzureAuthConnString, AzureAuthAnonymous, AzureAuthAzureAD:
	default:
		return "", fmt.Errorf("azure: unknown auth mode %q: use key, sas, connstr, anonymous or azuread", c.Auth)
	}
	for _, g := range given {
		if g.mode == mode && !g.set && mode != AzureAuthAnonymous && mode != AzureAuthAzureAD {
			return "", fmt.Errorf("azure: auth mode %s needs %s", mode, g.what)
		}
	}
	if c.Anonymous && mode != AzureAuthAnonymous {
		return "", fmt.Errorf("azure: conflicting credentials: anonymous access is asked for but the auth type is %s", mode)
	}
	if c.ClientID != "" && mode != AzureAuthAzureAD {
		return "", fmt.Errorf("azure: conflicting credentials: a managed identity client id (--identity-client-id, AZURE_STORAGE_IDENTITY_CLIENT_ID) is set but the auth type is %s", mode)
	}
	return mode, nil
}

type connString struct {
	account, endpoint, key, sas string
}

// parseConnectionString reads the subset of the storage connection string
// format that concerns the blob service. Parsing it here rather than in the
// SDK lets Validate report errors up front and lets every mode share one
// client constructor.
func parseConnectionString(s string) (connString, error) {
	var cs connString
	kv := map[string]string{}
	for _, part := range strings.Split(strings.TrimSpace(s), ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, v, ok := strings.Cut(part, "=")
		if !ok {
			// Do not echo the part: it may be the key.
			return cs, errors.New("azure: malformed connection string: expected Key=Value pairs separated by ';'")
		}
		kv[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
	}
	if strings.EqualFold(kv["usedevelopmentstorage"], "true") {
		return connString{account: AzuriteAccount, endpoint: azuriteEndpoint, key: AzuriteAccountKey}, nil
	}
	cs.account, cs.key, cs.sas = kv["accountname"], kv["accountkey"], strings.TrimPrefix(kv["sharedaccesssignature"], "?")
	cs.endpoint = kv["blobendpoint"]
	if cs.endpoint == "" {
		if cs.account == "" {
			return cs, errors.New("azure: connection string needs AccountName or BlobEndpoint")
		}
		proto, suffix := kv["defaultendpointsprotocol"], kv["endpointsuffix"]
		if proto == "" {
			proto = "https"
		}
		if suffix == "" {
			suffix = "core.windows.net"
		}
		cs.endpoint = fmt.Sprintf("%s://%s.blob.%s/", proto, cs.account, strings.Trim(suffix, "/"))
	}
	switch {
	case cs.key != "" && cs.sas != "":
		return cs, errors.New("azure: connection string has both AccountKey and SharedAccessSignature; keep one")
	case cs.key != "" && cs.account == "":
		return cs, errors.New("azure: connection string has AccountKey but no AccountName")
	case cs.key == "" && cs.sas == "":
		return cs, errors.New("azure: connection string needs AccountKey or SharedAccessSignature")
	}
	return cs, nil
}

// accountFromEndpoint guesses the account from the endpoint: the first path
// segment of a path-style URL (Azurite, http://127.0.0.1:10000/devstoreaccount1),
// else the first label of the host name (https://acct.blob.core.windows.net).
func accountFromEndpoint(u *url.URL) string {
	if seg, _, _ := strings.Cut(strings.Trim(u.Path, "/"), "/"); seg != "" {
		return seg
	}
	host := u.Hostname()
	if net.ParseIP(host) != nil {
		return ""
	}
	label, _, _ := strings.Cut(host, ".")
	return label
}

func validAccountName(s string) bool {
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

// validContainerName applies the service's rules so that a typo fails in
// Validate with a reason instead of as a 400 from the service.
func validContainerName(s string) error {
	if s == "" {
		return errors.New("azure: missing container name")
	}
	if s == "$root" || s == "$web" {
		return nil
	}
	bad := len(s) < 3 || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' || strings.Contains(s, "--")
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			bad = true
		}
	}
	if bad {
		return fmt.Errorf("azure: container name %q is invalid: 3 to 63 lowercase letters, digits and single hyphens, starting and ending with a letter or digit", s)
	}
	return nil
}

// newHTTPClient returns the HTTP client of one store: with guard, its
// connections refuse addresses blob requests must not go to (guardDial;
// not for the identity provider's, whose managed identity endpoint is the
// metadata service). The defaults of
// net/http keep 2 idle connections per host, so parallel block transfers
// would open and close a TLS connection per request; keep enough for wide
// fan-out instead. HTTP/2 stays off: the blob service speaks HTTP/1.1, and
// separate connections spread large transfers better than one multiplexed
// one.
func newHTTPClient(guard bool) *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}
	if guard {
		dialer.Control = guardDial
	}
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           dialer.DialContext,
		MaxIdleConns:          0, // no global cap; the per-host one applies
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		TLSClientConfig:       &tls.Config{MinVersion: tls.VersionTLS12},
		ForceAttemptHTTP2:     false,
		DisableCompression:    true, // ranged reads of binary data; keep Content-Length exact
		ReadBufferSize:        64 << 10,
		WriteBufferSize:       64 << 10,
	}}
}

// clientOptions returns the SDK pipeline options shared by every client of
// one store.
func (t azureTarget) clientOptions(hc *http.Client) azcore.ClientOptions {
	return azcore.ClientOptions{
		Transport: hc,
		// One try only: blobstore's own retry layer (NewRetrying) decides
		// what to retry, with its own budget, and would otherwise multiply
		// the SDK's attempts. TryTimeout still bounds each request.
		Retry:     policy.RetryOptions{MaxRetries: -1, TryTimeout: t.tryTimeout},
		Telemetry: policy.TelemetryOptions{ApplicationID: "blobfs"},
	}
}

// newContainerClient builds the SDK client for the target's container.
func (t azureTarget) newContainerClient(hc *http.Client) (*container.Client, error) {
	opts := &container.ClientOptions{ClientOptions: t.clientOptions(hc)}
	switch t.mode {
	case AzureAuthKey, AzureAuthConnString:
		if t.key == "" { // a connection string with a SAS
			return container.NewClientWithNoCredential(t.containerURL(), opts)
		}
		cred, err := container.NewSharedKeyCredential(t.account, t.key)
		if err != nil {
			return nil, fmt.Errorf("azure: account key: %w", err)
		}
		return container.NewClientWithSharedKeyCredential(t.containerURL(), cred, opts)
	case AzureAuthSAS, AzureAuthAnonymous:
		return container.NewClientWithNoCredential(t.containerURL(), opts)
	case AzureAuthAzureAD:
		// Tokens come from the identity provider, which for a managed
		// identity is the metadata service: a client of their own,
		// without the blob endpoint's guard.
		cred, err := t.tokenCredential(newHTTPClient(false))
		if err != nil {
			return nil, err
		}
		return container.NewClient(t.containerURL(), cred, opts)
	}
	return nil, fmt.Errorf("azure: unknown auth mode %q", t.mode)
}

// tokenCredential returns the Azure AD credential: the user-assigned
// managed identity named by ClientID, else the DefaultAzureCredential chain.
// Token requests keep the SDK's default retries (they are not blob
// operations and are not covered by NewRetrying).
func (t azureTarget) tokenCredential(hc *http.Client) (azcore.TokenCredential, error) {
	co := azcore.ClientOptions{Transport: hc}
	if t.clientID != "" {
		cred, err := azidentity.NewManagedIdentityCredential(&azidentity.ManagedIdentityCredentialOptions{
			ClientOptions: co,
			ID:            azidentity.ClientID(t.clientID),
		})
		if err != nil {
			return nil, fmt.Errorf("azure: managed identity %s: %w", t.clientID, err)
		}
		return markedCredential{cred}, nil
	}
	cred, err := azidentity.NewDefaultAzureCredential(&azidentity.DefaultAzureCredentialOptions{ClientOptions: co})
	if err != nil {
		return nil, fmt.Errorf("azure: Azure AD credential: %w", err)
	}
	return markedCredential{cred}, nil
}

// markedCredential tags token failures with tokenError, so that
// mapAzureError can tell "no token" (ErrUnauthorized) from a network
// failure of the blob request itself: azcore passes the credential's error
// through unchanged, and azidentity's own error types are not all exported.
type markedCredential struct{ azcore.TokenCredential }

func (c markedCredential) GetToken(ctx context.Context, opts policy.TokenRequestOptions) (azcore.AccessToken, error) {
	tk, err := c.TokenCredential.GetToken(ctx, opts)
	if err != nil {
		return tk, &tokenError{err}
	}
	return tk, nil
}

// tokenError is a failure to get an Azure AD token.
type tokenError struct{ err error }

func (e *tokenError) Error() string { return "Azure AD token: " + summarizeChain(e.err.Error()) }
func (e *tokenError) Unwrap() error { return e.err }

// summarizeChain shortens the error of DefaultAzureCredential, which lists
// every credential it tried with the SDK's whole explanation (over 1,000
// characters on a machine with none), to one line: each credential's name
// and the start of its reason. Other errors pass unchanged.
func summarizeChain(msg string) string {
	const head = "DefaultAzureCredential: failed to acquire a token."
	if !strings.HasPrefix(msg, head) {
		return msg
	}
	var tried []string
	for _, line := range strings.Split(msg, "\n") {
		line = strings.TrimSpace(line)
		name, reason, ok := strings.Cut(line, ": ")
		if !ok || !strings.HasSuffix(name, "Credential") || strings.Contains(name, " ") {
			continue
		}
		reason, _, _ = strings.Cut(reason, ". ")
		if len(reason) > 80 {
			reason = reason[:77] + "..."
		}
		tried = append(tried, name+" ("+reason+")")
	}
	if len(tried) == 0 {
		return head
	}
	return "no credential of the default chain could get one: " + strings.Join(tried, "; ") +
		"; give an account key, a SAS token or a connection string, or run where a managed or workload identity is"
}

// NoteAuthMode logs, at INFO, that a configuration without any credential
// authenticates with Azure AD's default chain: a user who forgot the
// account key should read why requests are refused, not guess.
func NoteAuthMode(log *slog.Logger, cfg AzureConfig) {
	if strings.TrimSpace(cfg.Auth) != "" || cfg.ClientID != "" {
		return
	}
	if mode, err := cfg.authMode(); err == nil && mode == AzureAuthAzureAD {
		log.Info("no account key, SAS token or connection string given: authenticating with Azure AD (environment, workload identity, managed identity, Azure CLI)",
			"account", cfg.Account, "container", cfg.Container)
	}
}

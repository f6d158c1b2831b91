package blobstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
)

// Redaction: the one place that takes secrets out of text blobfs writes.
// A SAS token travels in every request URL, and Go's HTTP client puts the
// whole URL into its errors ("Get \"https://...?sig=...\": dial tcp:
// ..."); the SDK's errors carry request headers; a connection string
// carries its key or SAS; a CSI request carries, outside the secrets
// fields that protosanitizer strips, volume attributes, parameters and
// mount flags in which blob-csi-driver's users put account keys and SAS
// tokens. Anything that may quote a request, a header, a connection
// string or a volume's attributes passes through Redact before it becomes
// an error message, a log line, an event or a line on a terminal:
//   - blobstore: every error the Azure backend returns (azureError, and
//     the configuration errors of NewAzure and Validate);
//   - callers: log handlers (NewRedactingHandler, in every binary and in
//     the CSI driver whatever logger it is given), gRPC status messages,
//     the CSI driver's Kubernetes events and blobfs's last error line on
//     stderr run Redact again, so that text built elsewhere from a store
//     error (or a secret that reached a message by another way) is caught
//     too.
//
// Redact keeps the shape of what it redacts ("sig=REDACTED"), so a reader
// still sees which credential was used, only not its value.

// Redacted replaces every secret value that Redact finds.
const Redacted = "REDACTED"

// sasQueryKeys are the query parameters of a SAS token (service, account and
// user delegation). sig is the secret; the others describe the grant
// (expiry, permissions, the delegating identity) and are redacted too, as
// Azure's own logging does, so that a log does not describe a usable grant.
var sasQueryKeys = []string{
	"sig", "se", "st", "sp", "sv", "sr", "srt", "ss", "spr", "sip", "si", "sdd", "ses",
	"skoid", "sktid", "skt", "ske", "sks", "skv", "saoid", "suoid", "sduoid", "scid",
}

// sensitiveKeys are names under which a credential is written as a
// name=value pair, a JSON member or a map entry (matched without regard to
// case): blob-csi-driver's secret keys, which it also accepts among volume
// attributes and mount options; the environment variables of Azure's SDKs
// and of blobfs mount; and common names. The whole value is redacted.
var sensitiveKeys = []string{
	"azurestorageaccountkey", "azurestorageaccountsastoken", "azurestorageconnectionstring",
	"azurestoragespnclientsecret", "msisecret",
	"azure_storage_key", "azure_storage_access_key", "azure_storage_account_key",
	"azure_storage_sas_token", "azure_storage_connection_string", "azure_client_secret",
	"accountkey", "account_key", "account-key", "sastoken", "sas_token", "sas-token",
	"clientsecret", "client_secret", "client-secret", "sharedaccesskey",
	"connectionstring", "connection_string", "connection-string", "connstring",
	"password", "access_token", "refresh_token",
}

var (
	// A SAS query parameter after ?, & or ;, URL-encoded after %3F or
	// %26 (a URL inside another URL's query), or after \u0026 (an & as
	// encoding/json writes it). The value ends at the next separator,
	// quote, space or backslash.
	sasParam = regexp.MustCompile(`(?i)((?:[?&;]|%3F|%26|\\u0026)(?:` + strings.Join(sasQueryKeys, "|") + `)(?:=|%3D))[^&;\s"'<>#%\\]*(?:%[0-9A-Fa-f]{2}[^&;\s"'<>#%\\]*)*`)
	// A signature with nothing before it: a SAS token without its "?"
	// that starts a string, a word or a quoted value. Only sig: the other
	// SAS names are too short to be told from ordinary words there.
	bareSig = regexp.MustCompile(`(?i)((?:^|[\s"'(\[{,=:])sig(?:=|%3D))[^&;\s"'<>#%\\]*(?:%[0-9A-Fa-f]{2}[^&;\s"'<>#%\\]*)*`)
	// Connection-string secrets, and a client secret in a form body. The
	// value ends at ';' (the connection string's next field), ',' (the
	// next mount option), '&', a space or a quote.
	keyValue = regexp.MustCompile(`(?i)((?:AccountKey|SharedAccessKey|client_secret|ClientSecret)\s*[=:]\s*)[^;,\s"'&]+`)
	// A sensitive key as a JSON member (also as JSON quoted once more,
	// \"name\":\"value\"): the whole string value.
	jsonKey = regexp.MustCompile(`(?i)(\\?"(?:` + strings.Join(sensitiveKeys, "|") + `)\\?"\s*:\s*\\?")(?:[^"\\]|\\[^"])*`)
	// A sensitive key as name=value (a mount option, a query, the
	// environment) or name:value (a Go map printed with %v). The value
	// ends at a space, comma, semicolon, &, quote or backslash: a SAS
	// token's other parameters after & are sasParam's.
	namedKey = regexp.MustCompile(`(?i)((?:^|[^A-Za-z0-9_])(?:` + strings.Join(sensitiveKeys, "|") + `)(?:\s*=\s*|:))[^\s,;&"'\\]+`)
	// A sensitive key as a YAML line (a Secret's stringData).
	yamlKey = regexp.MustCompile(`(?im)(^[ \t-]*(?:` + strings.Join(sensitiveKeys, "|") + `):[ \t]+)[^\s,;&"'\\]+`)
	// A field of a Go struct printed with %+v ({Account:acct Key:...}):
	// the generic field names, as Go prints them (no space after the
	// colon; an empty value prints nothing, so nothing is taken).
	structField = regexp.MustCompile(`((?:^|[{\s])(?:[Kk]ey|[Tt]oken|[Ss]ecret):)[^\s}]+`)
	// A connection string's SAS runs to the next ';' (it has '&' inside).
	connSAS = regexp.MustCompile(`(?i)(SharedAccessSignature\s*=\s*)[^;\s"']+`)
	// Credential-bearing HTTP headers, as the SDK prints them ("Name: value"
	// lines) or as they appear in a dump.
	secretHeader = regexp.MustCompile(`(?im)((?:Authorization|Proxy-Authorization|x-ms-copy-source-authorization|x-ms-encryption-key|x-ms-copy-source)\s*:\s*)[^\r\n"]+`)
	// Bearer tokens and shared-key signatures wherever they stand.
	schemeCred = regexp.MustCompile(`(?i)\b((?:Bearer|SharedKey|SharedKeyLite)\s+)[A-Za-z0-9._~+/=:\-]+`)
	// A JSON Web Token on its own (an Azure AD or service account token):
	// three base64url segments, the first a JSON object ("{\"" is eyJ).
	jwt = regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]*`)
)

// Redact returns s with every credential it can recognise replaced by
// REDACTED: SAS query values (sig, se, sp, skoid, ...) in URLs, plain,
// URL-encoded or JSON-escaped, and a bare sig=; AccountKey and
// SharedAccessSignature in connection strings; the values of sensitive
// keys (azurestorageaccountkey, azurestorageaccountsastoken, msisecret,
// AZURE_STORAGE_SAS_TOKEN, ...: sensitiveKeys) as name=value, JSON
// members, map entries and YAML lines; Key, Token and Secret fields of a
// struct printed with %+v; Authorization and x-ms-copy-source headers;
// bearer tokens, shared-key signatures and bare JSON Web Tokens;
// client_secret. It is cheap when there is nothing to redact.
func Redact(s string) string {
	if !maybeSecret(s) {
		return s
	}
	s = secretHeader.ReplaceAllString(s, "${1}"+Redacted)
	s = jsonKey.ReplaceAllString(s, "${1}"+Redacted)
	s = keyValue.ReplaceAllString(s, "${1}"+Redacted)
	s = namedKey.ReplaceAllString(s, "${1}"+Redacted)
	s = yamlKey.ReplaceAllString(s, "${1}"+Redacted)
	s = structField.ReplaceAllString(s, "${1}"+Redacted)
	s = connSAS.ReplaceAllString(s, "${1}"+Redacted)
	s = schemeCred.ReplaceAllString(s, "${1}"+Redacted)
	s = jwt.ReplaceAllString(s, Redacted)
	s = sasParam.ReplaceAllString(s, "${1}"+Redacted)
	s = bareSig.ReplaceAllString(s, "${1}"+Redacted)
	return s
}

// maybeSecret is a fast pre-check: text without '=', ':', "%3D", the word
// bearer or a JWT's eyJ has nothing Redact would replace.
func maybeSecret(s string) bool {
	return strings.ContainsAny(s, "=:") || strings.Contains(s, "%3D") || strings.Contains(s, "%3d") ||
		containsFoldASCII(s, "bearer") || strings.Contains(s, "eyJ")
}

// containsFoldASCII reports whether s holds lower (ASCII lower case) in
// any case, without the copy strings.ToLower would make.
func containsFoldASCII(s, lower string) bool {
	for i := 0; i+len(lower) <= len(s); i++ {
		j := 0
		for ; j < len(lower); j++ {
			if s[i+j]|0x20 != lower[j] {
				break
			}
		}
		if j == len(lower) {
			return true
		}
	}
	return false
}

// RedactError returns err with its message redacted. errors.Is and
// errors.As still reach the causes; a *url.Error among them (the HTTP
// client's, which quotes the request URL) has its URL redacted in place,
// so that a caller that digs it out prints no secret either.
func RedactError(err error) error {
	if err == nil {
		return nil
	}
	var re *redactedError
	if errors.As(err, &re) && re == err {
		return err
	}
	redactURLErrors(err)
	msg := err.Error()
	if red := Redact(msg); red != msg {
		return &redactedError{msg: red, err: err}
	}
	return err
}

// redactedError is an error whose message had secrets in it.
type redactedError struct {
	msg string // redacted message
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }

// redactURLErrors redacts, in place, the URL of every *url.Error in err's
// chain: the HTTP client's errors quote the request URL, SAS included.
func redactURLErrors(err error) {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = Redact(ue.URL)
	}
}

// NewRedactingHandler wraps h so that every record's message and attribute
// values pass through Redact: the last line of defence for text that
// reached a log line without passing through a blobstore error (an error
// from another library, a request echoed back). blobfs's binaries log
// through it.
func NewRedactingHandler(h slog.Handler) slog.Handler {
	if rh, ok := h.(redactingHandler); ok {
		return rh
	}
	return redactingHandler{h}
}

type redactingHandler struct{ inner slog.Handler }

func (h redactingHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h redactingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, Redact(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(redactAttr(a))
		return true
	})
	return h.inner.Handle(ctx, out)
}

func (h redactingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	red := make([]slog.Attr, len(as))
	for i, a := range as {
		red[i] = redactAttr(a)
	}
	return redactingHandler{h.inner.WithAttrs(red)}
}

func (h redactingHandler) WithGroup(name string) slog.Handler {
	return redactingHandler{h.inner.WithGroup(name)}
}

// redactAttr redacts a value as the handler would print it: strings,
// errors and Stringers by their text, groups member by member, other
// values (structs, maps) by their %+v. Numbers, times and durations pass
// unchanged, and so does a value with nothing to redact.
func redactAttr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		if s := v.String(); maybeSecret(s) {
			a.Value = slog.StringValue(Redact(s))
		}
	case slog.KindGroup:
		g := v.Group()
		red := make([]slog.Attr, len(g))
		for i, m := range g {
			red[i] = redactAttr(m)
		}
		a.Value = slog.GroupValue(red...)
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			if s := x.Error(); maybeSecret(s) {
				a.Value = slog.StringValue(Redact(s))
			}
		case fmt.Stringer:
			if s := x.String(); maybeSecret(s) {
				a.Value = slog.StringValue(Redact(s))
			}
		case []byte:
			a.Value = slog.StringValue(Redact(string(x)))
		default:
			// %+v, as the text handler prints it: field names show,
			// and with them a struct's Key or Token. The JSON handler
			// prints names too, so what %+v shows of a secret it would.
			if s := fmt.Sprintf("%+v", x); maybeSecret(s) {
				if red := Redact(s); red != s {
					a.Value = slog.StringValue(red)
				}
			}
		}
	default:
		a.Value = v
	}
	return a
}

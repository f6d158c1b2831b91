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

// Redaction: the one place that takes secrets out of text about store
// requests. A SAS token travels in every request URL, and Go's HTTP client
// puts the whole URL into its errors ("Get \"https://...?sig=...\": dial
// tcp: ..."); the SDK's errors carry request headers; a connection string
// carries its key or SAS. Anything that may quote a request, a header or a
// connection string passes through Redact before it becomes an error
// message or a log line:
//   - blobstore: every error the Azure backend returns (azureError, and
//     the configuration errors of NewAzure and Validate);
//   - callers: log handlers and gRPC status messages run Redact again, so
//     that text built elsewhere from a store error (or a secret that
//     reached a message by another way) is caught too.
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

var (
	// A SAS query parameter after ?, & or ;, or URL-encoded after %3F or
	// %26 (a URL inside another URL's query). The value ends at the next
	// separator, quote or space.
	sasParam = regexp.MustCompile(`(?i)((?:[?&;]|%3F|%26)(?:` + strings.Join(sasQueryKeys, "|") + `)(?:=|%3D))[^&;\s"'<>#%]*(?:%[0-9A-Fa-f]{2}[^&;\s"'<>#%]*)*`)
	// Connection-string secrets, and a client secret in a form body.
	keyValue = regexp.MustCompile(`(?i)((?:AccountKey|SharedAccessKey|client_secret|ClientSecret)\s*[=:]\s*)[^;\s"'&]+`)
	// A connection string's SAS runs to the next ';' (it has '&' inside).
	connSAS = regexp.MustCompile(`(?i)(SharedAccessSignature\s*=\s*)[^;\s"']+`)
	// Credential-bearing HTTP headers, as the SDK prints them ("Name: value"
	// lines) or as they appear in a dump.
	secretHeader = regexp.MustCompile(`(?im)((?:Authorization|Proxy-Authorization|x-ms-copy-source-authorization|x-ms-encryption-key|x-ms-copy-source)\s*:\s*)[^\r\n"]+`)
	// Bearer tokens and shared-key signatures wherever they stand.
	schemeCred = regexp.MustCompile(`(?i)\b((?:Bearer|SharedKey|SharedKeyLite)\s+)[A-Za-z0-9._~+/=:\-]+`)
)

// Redact returns s with every credential it can recognise replaced by
// REDACTED: SAS query values (sig, se, sp, skoid, ...) in URLs, plain or
// URL-encoded; AccountKey and SharedAccessSignature in connection strings;
// Authorization and x-ms-copy-source headers; bearer tokens and shared-key
// signatures; client_secret. It is cheap when there is nothing to redact.
func Redact(s string) string {
	if !maybeSecret(s) {
		return s
	}
	s = secretHeader.ReplaceAllString(s, "${1}"+Redacted)
	s = keyValue.ReplaceAllString(s, "${1}"+Redacted)
	s = connSAS.ReplaceAllString(s, "${1}"+Redacted)
	s = schemeCred.ReplaceAllString(s, "${1}"+Redacted)
	s = sasParam.ReplaceAllString(s, "${1}"+Redacted)
	return s
}

// maybeSecret is a fast pre-check: text without '=', ':', "%3D" or the
// word bearer (a JWT has none of the others) has nothing Redact would
// replace.
func maybeSecret(s string) bool {
	return strings.ContainsAny(s, "=:") || strings.Contains(s, "%3D") || strings.Contains(s, "%3d") || containsFoldASCII(s, "bearer")
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
// errors and Stringers by their text, groups member by member. Numbers,
// times and durations pass unchanged.
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
			if s := fmt.Sprint(x); maybeSecret(s) {
				a.Value = slog.StringValue(Redact(s))
			}
		}
	default:
		a.Value = v
	}
	return a
}

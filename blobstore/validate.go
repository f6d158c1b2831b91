package blobstore

import (
	"encoding/base64"
	"fmt"
	"maps"
	"strings"
	"unicode/utf8"
)

// Limits of Azure Blob Storage that every backend enforces, so that code
// that works against a fake also works against the service.
const (
	// MaxNameLength is the longest blob name, in characters.
	MaxNameLength = 1024
	// MaxMetadataSize bounds the total size of a blob's metadata keys and
	// values, in bytes.
	MaxMetadataSize = 8 << 10
	// MaxBlocks is the largest number of blocks one blob may be committed
	// from.
	MaxBlocks = 50_000
	// MaxBlockIDLength is the longest block id, in bytes before base64.
	MaxBlockIDLength = 64
	// MaxListResults is the largest (and the default) List page size.
	MaxListResults = 5000
)

// ValidateName reports, wrapping ErrInvalidName, why name cannot be stored
// as a blob by every backend. Besides the obvious (empty, too long, not
// UTF-8, NUL), it refuses names that Azure or its SDKs would silently change:
// a leading "/", empty segments ("a//b", a trailing "/"), and any segment
// that ends with "." (this covers "." and ".."; Azure trims trailing dots
// of path segments, so "file." would come back as "file"). Refusing them is
// the design rule "never silently mangled": the filesystem turns the error
// into EINVAL.
func ValidateName(name string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w %q: %s", ErrInvalidName, name, why)
	}
	switch {
	case name == "":
		return fmt.Errorf("%w: empty name", ErrInvalidName)
	case !utf8.ValidString(name):
		return bad("not valid UTF-8")
	case utf8.RuneCountInString(name) > MaxNameLength:
		return bad(fmt.Sprintf("longer than %d characters", MaxNameLength))
	case strings.IndexByte(name, 0) >= 0:
		return bad("contains NUL")
	case name[0] == '/':
		return bad("leading /")
	}
	for seg := range strings.SplitSeq(name, "/") {
		switch {
		case seg == "":
			return bad("empty path segment")
		case strings.HasSuffix(seg, "."):
			return bad(fmt.Sprintf("segment %q ends with a dot, which Azure trims", seg))
		}
	}
	return nil
}

// ValidateMetadata reports, wrapping ErrInvalidName, why md cannot be stored
// as blob metadata. Azure sends metadata as HTTP headers: keys must be C#
// identifiers and are case-insensitive, values must be printable ASCII
// without leading or trailing spaces (HTTP would strip them), and the total
// size is bounded.
func ValidateMetadata(md map[string]string) error {
	size := 0
	lower := make(map[string]bool, len(md))
	for k, v := range md {
		if !isIdentifier(k) {
			return fmt.Errorf("%w: metadata key %q is not an identifier ([A-Za-z_][A-Za-z0-9_]*)", ErrInvalidName, k)
		}
		lk := strings.ToLower(k)
		if lower[lk] {
			return fmt.Errorf("%w: metadata key %q given twice (keys are case-insensitive)", ErrInvalidName, k)
		}
		lower[lk] = true
		for i := 0; i < len(v); i++ {
			if v[i] < 0x20 || v[i] > 0x7e {
				return fmt.Errorf("%w: metadata value of %q holds a byte (%#x) that is not printable ASCII", ErrInvalidName, k, v[i])
			}
		}
		if strings.TrimSpace(v) != v {
			return fmt.Errorf("%w: metadata value of %q has leading or trailing spaces, which HTTP strips", ErrInvalidName, k)
		}
		size += len(k) + len(v)
	}
	if size > MaxMetadataSize {
		return fmt.Errorf("%w: metadata is %d bytes, more than %d", ErrInvalidName, size, MaxMetadataSize)
	}
	return nil
}

func isIdentifier(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// cloneMetadata copies md so that neither the caller nor the store can
// change the other's map later. It returns nil for an empty map, so that
// every backend reports "no metadata" the same way.
func cloneMetadata(md map[string]string) map[string]string {
	if len(md) == 0 {
		return nil
	}
	return maps.Clone(md)
}

// checkWrite validates what every write of a whole blob must satisfy.
func checkWrite(name string, opts PutOptions) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if err := ValidateMetadata(opts.Metadata); err != nil {
		return err
	}
	return checkConditions(opts.Conditions)
}

// checkConditions validates a Conditions value itself: Azure accepts one
// ETag condition per request and answers 400 to If-Match together with
// If-None-Match.
func checkConditions(c Conditions) error {
	if c.IfMatch != "" && c.IfNoneMatch {
		return fmt.Errorf("blobstore: IfMatch and IfNoneMatch cannot be combined")
	}
	return nil
}

// evalConditions decides a conditional request against the blob's current
// state, the way Azure does for writes: If-None-Match:* fails with
// ErrAlreadyExists on an existing blob; If-Match fails with
// ErrPreconditionFailed unless the blob exists with that ETag ("*" matches
// any existing blob).
func evalConditions(name string, c Conditions, exists bool, etag string) error {
	if c.IfNoneMatch && exists {
		return fmt.Errorf("%q: %w", name, ErrAlreadyExists)
	}
	if c.IfMatch != "" && (!exists || (c.IfMatch != "*" && c.IfMatch != etag)) {
		return fmt.Errorf("%q: etag is not %s: %w", name, c.IfMatch, ErrPreconditionFailed)
	}
	return nil
}

// validateBlockID checks a block id the way Azure does: valid standard
// base64 of 1 to MaxBlockIDLength bytes.
func validateBlockID(id string) error {
	raw, err := base64.StdEncoding.DecodeString(id)
	if err != nil || len(raw) == 0 || len(raw) > MaxBlockIDLength {
		return fmt.Errorf("blobstore: invalid block id %q: want base64 of 1 to %d bytes", id, MaxBlockIDLength)
	}
	return nil
}

// sameBlockIDLength enforces Azure's rule that all block ids of a blob
// have the same length. It compares decoded lengths, the stricter reading
// (equal decoded lengths imply equal encoded ones); both ids must be
// valid.
func sameBlockIDLength(name, id, staged string) error {
	if decodedLen(id) != decodedLen(staged) {
		return fmt.Errorf("blobstore: %q: block id %q differs in length from staged block %q", name, id, staged)
	}
	return nil
}

func decodedLen(id string) int {
	raw, _ := base64.StdEncoding.DecodeString(id)
	return len(raw)
}

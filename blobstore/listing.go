package blobstore

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
)

// This file holds the listing algorithm that the Memory and Local backends
// share, so that both page, group and order exactly like Azure:
//
//   - names come in byte order of the full name;
//   - with a delimiter, every name whose remainder after Prefix contains the
//     delimiter is rolled up into one common prefix (ending with the
//     delimiter), which takes that name's place in the order: prefixes and
//     blobs interleave;
//   - a page holds at most MaxResults entries, blobs and prefixes together;
//     NextMarker continues after the page's last entry.
//
// The source only has to answer "the first blob whose name is >= key", and
// is asked with keys that never decrease, so a source may walk forward
// without going back (Local walks a directory tree this way). Skipping a
// rolled-up prefix is one seek past every name that starts with it, so a
// directory with a million entries under one prefix costs one step.

// listMarkerVersion starts every marker this package makes, so that a
// marker from another backend (or a made-up one) is refused rather than
// misread.
const listMarkerVersion = "m1."

// encodeListMarker makes an opaque continuation token from the key at
// which the next page starts. It is opaque on purpose: Azure's markers are,
// and callers must not build their own.
func encodeListMarker(key string) string {
	return listMarkerVersion + base64.RawURLEncoding.EncodeToString([]byte(key))
}

func decodeListMarker(marker string) (string, error) {
	enc, ok := strings.CutPrefix(marker, listMarkerVersion)
	if ok {
		key, err := base64.RawURLEncoding.DecodeString(enc)
		if err == nil {
			return string(key), nil
		}
	}
	return "", fmt.Errorf("blobstore: invalid list marker %q (not from a previous page of this store)", marker)
}

// pageSize returns the effective page size of opts.
func pageSize(opts ListOptions) (int, error) {
	switch {
	case opts.MaxResults < 0:
		return 0, fmt.Errorf("blobstore: negative MaxResults %d", opts.MaxResults)
	case opts.MaxResults == 0 || opts.MaxResults > MaxListResults:
		return MaxListResults, nil
	}
	return opts.MaxResults, nil
}

// prefixEnd returns the smallest string greater than every string that
// starts with p, and false if there is none (p is all 0xff bytes).
func prefixEnd(p string) (string, bool) {
	b := []byte(p)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0xff {
			b[i]++
			return string(b[:i+1]), true
		}
	}
	return "", false
}

// listPage computes one page of a listing over a source of blobs in byte
// order. seek returns the first blob whose name is >= key (ok false when
// there is none); its keys never decrease within one call. T is whatever
// the source needs to produce the blob's Attrs later, so that rolled-up
// blobs cost nothing.
func listPage[T any](ctx context.Context, opts ListOptions, seek func(key string) (item T, name string, ok bool, err error)) (blobs []T, prefixes []string, next string, err error) {
	limit, err := pageSize(opts)
	if err != nil {
		return nil, nil, "", err
	}
	key := opts.Prefix
	if opts.Marker != "" {
		m, err := decodeListMarker(opts.Marker)
		if err != nil {
			return nil, nil, "", err
		}
		key = max(key, m)
	}
	for n := 0; ; n++ {
		if err := ctx.Err(); err != nil {
			return nil, nil, "", err
		}
		item, name, ok, err := seek(key)
		if err != nil {
			return nil, nil, "", err
		}
		if !ok || !strings.HasPrefix(name, opts.Prefix) {
			// Names with the prefix are contiguous in byte order:
			// the first one without it ends the listing.
			return blobs, prefixes, "", nil
		}
		if n == limit {
			// There is more; the next page starts here.
			return blobs, prefixes, encodeListMarker(key), nil
		}
		if d := opts.Delimiter; d != "" {
			if i := strings.Index(name[len(opts.Prefix):], d); i >= 0 {
				p := name[:len(opts.Prefix)+i+len(d)]
				prefixes = append(prefixes, p)
				end, ok := prefixEnd(p)
				if !ok {
					return blobs, prefixes, "", nil
				}
				key = end
				continue
			}
		}
		blobs = append(blobs, item)
		// Names never contain NUL, so name+"\x00" is the next
		// possible name.
		key = name + "\x00"
	}
}

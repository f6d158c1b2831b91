package blobstore_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/blobfs/blobfs/blobstore"
)

// TestLoggedStore: at debug level every call is logged with what it was
// about, and passes through unchanged (results and wrapped errors); data
// and metadata values never reach the log. Below debug level the store is
// returned unwrapped.
func TestLoggedStore(t *testing.T) {
	mem := blobstore.NewMemory()
	var quiet bytes.Buffer
	if s := blobstore.NewLogged(mem, slog.New(slog.NewTextHandler(&quiet, nil))); s != blobstore.Store(mem) {
		t.Fatal("at info level the store was wrapped")
	}

	var out bytes.Buffer
	s := blobstore.NewLogged(mem, slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	ctx := t.Context()
	if _, err := s.Put(ctx, "d/a", []byte("secret content"), blobstore.PutOptions{Metadata: map[string]string{"k": "secret value"}, Conditions: blobstore.Conditions{IfNoneMatch: true}}); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 6)
	if n, err := s.ReadAt(ctx, "d/a", p, 0, ""); err != nil || n != 6 || string(p) != "secret" {
		t.Fatalf("ReadAt through the logged store: %d %q %v", n, p, err)
	}
	page, err := s.List(ctx, blobstore.ListOptions{Prefix: "d/", Delimiter: "/"})
	if err != nil || len(page.Blobs) != 1 {
		t.Fatalf("List through the logged store: %v %v", page, err)
	}
	if _, err := s.Stat(ctx, "d/missing"); !errors.Is(err, blobstore.ErrNotFound) {
		t.Fatalf("Stat of a missing blob: %v, want ErrNotFound through the wrapper", err)
	}

	log := out.String()
	for _, want := range []string{
		`msg="store Put" name=d/a len=14 if_match=false if_none_match=true took=`,
		`msg="store ReadAt" name=d/a off=0 len=6 read=6 took=`,
		`msg="store List" prefix=d/ delimiter=/ max=0 continued=false blobs=1 prefixes=0 more=false took=`,
		`msg="store Stat" name=d/missing size=0 took=`,
		`err=`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "secret") {
		t.Errorf("data or metadata reached the log:\n%s", log)
	}
}

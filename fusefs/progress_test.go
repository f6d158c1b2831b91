package fusefs

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/blobstore/storetest"
	"github.com/blobfs/blobfs/fusefs/upload"
)

// slowStages delays every staged block, as a slow link would.
type slowStages struct {
	blobstore.Store
	delay time.Duration
}

func (s slowStages) StageBlock(ctx context.Context, name, id string, data []byte) error {
	time.Sleep(s.delay)
	return s.Store.StageBlock(ctx, name, id, data)
}

// TestSlowUploadReportsProgress: a close that waits for a long upload logs
// its progress while it runs, and once when it is done; the data arrives.
func TestSlowUploadReportsProgress(t *testing.T) {
	old := upload.ProgressEvery
	upload.ProgressEvery = 200 * time.Millisecond
	defer func() { upload.ProgressEvery = old }()
	mem := storetest.Memory(t)
	log, logged := capturingLogger(t)
	mnt, _ := mountStore(t, slowStages{mem, 100 * time.Millisecond},
		Options{Logger: log, UploadBlockSize: 64 << 10, UploadConcurrency: 1})

	// Written last block first: not a sequential stream, so the whole
	// file goes up at close.
	data := pattern(1<<20, 9)
	f, err := os.Create(join(mnt, "big.bin"))
	if err != nil {
		t.Fatal(err)
	}
	half := len(data) / 2
	if _, err := f.WriteAt(data[half:], int64(half)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(data[:half], 0); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	wantBlob(t, mem, "big.bin", data)
	var progress, done int
	for _, l := range strings.Split(logged.String(), "\n") {
		switch {
		case strings.Contains(l, "msg=uploading") && strings.Contains(l, "path=big.bin") && strings.Contains(l, "size_bytes=1048576") && strings.Contains(l, "eta="):
			progress++
		case strings.Contains(l, "msg=uploaded") && strings.Contains(l, "path=big.bin"):
			done++
		}
	}
	if progress < 2 || done != 1 {
		t.Fatalf("%d progress lines and %d end lines, want 2 or more and 1:\n%s", progress, done, logged)
	}
}

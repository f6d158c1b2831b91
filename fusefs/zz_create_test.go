package fusefs

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

func TestZZCreateRatio(t *testing.T) {
	mem := blobstore.NewMemory()
	store := blobstore.NewFaulty(mem, blobstore.FaultOptions{Seed: 1, Latency: 5 * time.Millisecond})
	mnt, _ := mountStore(t, store, Options{})
	content := make([]byte, 4096)
	for rep := range 3 {
		os.Mkdir(join(mnt, fmt.Sprint("d", rep)), 0o755)
		time.Sleep(200 * time.Millisecond)
		start := time.Now()
		for i := range 1000 {
			f, err := os.OpenFile(join(mnt, fmt.Sprintf("d%d/f%05d", rep, i)), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
			if err != nil {
				t.Fatal(err)
			}
			f.Write(content)
			f.Close()
		}
		total := time.Since(start)
		ds := time.Now()
		for i := range 1000 {
			store.Put(t.Context(), fmt.Sprintf("x%d/f%05d", rep, i), content, blobstore.PutOptions{})
		}
		dtotal := time.Since(ds)
		t.Logf("total %v direct %v ratio %.3f", total, dtotal, float64(dtotal)/float64(total))
	}
}

package main

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/blobfs/blobfs/fusefs/cache"
)

// diskCacheFlags are --disk-cache-mb and --disk-cache-dir, of `blobfs
// mount` and of `blobfs csi`.
type diskCacheFlags struct {
	mb  int64
	dir string
}

func (f diskCacheFlags) check() error {
	if f.mb < 0 || f.mb > 1<<30 {
		return fmt.Errorf("--disk-cache-mb %d: must be between 0 (no disk cache) and 1073741824 (MiB)", f.mb)
	}
	return nil
}

// diskCacheWait is how long open waits for the directory's previous user
// (a worker or driver being replaced) to exit.
const diskCacheWait = 15 * time.Second

// open opens the disk cache the flags ask for, or returns nil for none.
func (f diskCacheFlags) open(logger *slog.Logger) (*cache.DiskCache, error) {
	if f.mb == 0 {
		return nil, nil
	}
	deadline := time.Now().Add(diskCacheWait)
	for logged := false; ; {
		c, err := cache.OpenDiskCache(f.dir, f.mb<<20)
		if err == nil {
			logger.Info("disk cache", "dir", f.dir, "mb", f.mb)
			return c, nil
		}
		if !errors.Is(err, cache.ErrDiskCacheInUse) || time.Now().After(deadline) {
			return nil, fmt.Errorf("--disk-cache-dir: %w", err)
		}
		if !logged {
			logger.Info("disk cache directory in use: waiting for the previous process to exit", "dir", f.dir, "wait", diskCacheWait)
			logged = true
		}
		time.Sleep(200 * time.Millisecond)
	}
}

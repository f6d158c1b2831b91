package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/blobfs/blobfs/blobstore"
)

// Figure ids, in the order they run and are reported.
const (
	FigSeqRead     = "seq-read"
	FigSeqReadWarm = "seq-read-warm"
	FigSeqWrite    = "seq-write"
	// FigSeqWriteOwnCPU is FigSeqWrite with Azurite on a CPU of its own.
	FigSeqWriteOwnCPU = "seq-write-own-cpu"
	FigSmallCreate    = "small-create"
	FigSmallList      = "small-list"
	FigSmallRead      = "small-read"
	FigRandRead       = "rand-read"
	// FigRandReadWarm is FigRandRead with the file in the disk cache.
	FigRandReadWarm = "rand-read-warm"
	// FigSeqReadCached re-reads a file whole in the disk cache.
	FigSeqReadCached = "seq-read-cached"
	// FigWriteBack and FigWriteBackSmall: --write-back against the
	// durable default.
	FigWriteBack      = "write-back"
	FigWriteBackSmall = "write-back-small"
	FigFaultyRead     = "faulty-read"
	FigFaultyWrite    = "faulty-write"
	// FigFaultyCreate: small-create's target, at a real store's latency.
	FigFaultyCreate = "faulty-create"
	// FigFaultyLog: a file appended to and fsync'ed as it grows.
	FigFaultyLog = "faulty-log"
	FigFUSE      = "fuse"
	FigMemory    = "memory"
	// FigMemoryMounts: many mounts of one process under its budget.
	FigMemoryMounts = "memory-mounts"
)

// FigureIDs returns every figure id in run order.
func FigureIDs() []string {
	return []string{FigSeqRead, FigSeqReadWarm, FigSeqWrite, FigSeqWriteOwnCPU, FigSmallCreate, FigSmallList, FigSmallRead,
		FigRandRead, FigRandReadWarm, FigSeqReadCached, FigWriteBack, FigWriteBackSmall, FigFaultyRead, FigFaultyWrite, FigFaultyCreate, FigFaultyLog, FigFUSE, FigMemory, FigMemoryMounts}
}

// optInFigures run only when named. seq-read-warm uploads two more files of
// Config.Size (more for small files), which on top of the rest of a full
// run pass an in-memory Azurite's memory limit (seen: every figure after
// seq-write failed with MemoryExtentStoreAtSizeLimit).
//
// The random-read and write-back figures upload 2 GiB and 6 GiB more: they
// run when named, and a full `make bench` runs them afterwards on a fresh
// Azurite (.ci/bench.sh).
var optInFigures = []string{FigSeqReadWarm, FigRandRead, FigRandReadWarm, FigSeqReadCached, FigWriteBack, FigWriteBackSmall}

// OptInFigureIDs returns the figures that run only when named.
func OptInFigureIDs() []string { return slices.Clone(optInFigures) }

// DefaultFigureIDs returns the figures of a run that names none ("all"):
// every figure but the opt-in ones, in run order.
func DefaultFigureIDs() []string {
	return slices.DeleteFunc(FigureIDs(), func(f string) bool { return slices.Contains(optInFigures, f) })
}

// azuriteFigures are the figures that need Azurite.
var azuriteFigures = []string{FigSeqRead, FigSeqReadWarm, FigSeqWrite, FigSeqWriteOwnCPU, FigSmallCreate, FigSmallList, FigSmallRead, FigRandRead, FigRandReadWarm, FigSeqReadCached, FigWriteBack, FigWriteBackSmall}

// figureGroups are shorthands accepted by ParseFigures; none holds an
// opt-in figure.
var figureGroups = map[string][]string{
	"all":        DefaultFigureIDs(),
	"seq":        {FigSeqRead, FigSeqWrite, FigSeqWriteOwnCPU},
	"small":      {FigSmallCreate, FigSmallList, FigSmallRead},
	"random":     {FigRandRead, FigRandReadWarm, FigSeqReadCached},
	"write-back": {FigWriteBack, FigWriteBackSmall},
	"faulty":     {FigFaultyRead, FigFaultyWrite, FigFaultyCreate, FigFaultyLog},
	// azurite: the default figures that need Azurite.
	"azurite": {FigSeqRead, FigSeqWrite, FigSeqWriteOwnCPU, FigSmallCreate, FigSmallList, FigSmallRead},
	// local: every figure that runs without Azurite.
	"local": {FigFaultyRead, FigFaultyWrite, FigFaultyCreate, FigFaultyLog, FigFUSE, FigMemory, FigMemoryMounts},
}

// ParseFigures turns a comma-separated list of figure ids and group names
// (all, seq, small, random, write-back, faulty, azurite, local) into figure ids in run order.
func ParseFigures(s string) ([]string, error) {
	want := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if g, ok := figureGroups[f]; ok {
			for _, id := range g {
				want[id] = true
			}
			continue
		}
		if !slices.Contains(FigureIDs(), f) {
			return nil, fmt.Errorf("unknown figure %q: use %s, or a group: all, seq, small, random, write-back, faulty, azurite, local", f, strings.Join(FigureIDs(), ", "))
		}
		want[f] = true
	}
	var ids []string
	for _, id := range FigureIDs() {
		if want[id] {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, errors.New("no figure selected")
	}
	return ids, nil
}

// Config describes one benchmark run. DefaultConfig and QuickConfig give
// complete ones; Run validates it.
type Config struct {
	// Endpoint is Azurite's blob endpoint, account included:
	// http://127.0.0.1:10000/devstoreaccount1. Account is taken from its
	// path; Key defaults to Azurite's well-known key.
	Endpoint string
	Key      string

	// BlobfsBin is the blobfs binary (make build puts it at bin/blobfs).
	BlobfsBin string
	// BlobfsArgs are extra `blobfs mount` flags for the Azurite figures,
	// e.g. --readahead-blocks=32, to try a tuning.
	BlobfsArgs []string
	// CompareArgs, when set, measures a second blobfs beside the first in
	// the Azurite figures, with these flags added (for example
	// --posix-attrs=false), interleaved in one run like the other clients.
	CompareArgs []string
	// InProcess serves the Azurite figures' blobfs mount from this
	// process (fusefs over blobstore.NewAzure, default options) instead
	// of the blobfs binary, so that a CPU profile of this process covers
	// blobfs. A diagnostic: the table says so.
	InProcess bool

	// Figures to run, from FigureIDs.
	Figures []string
	// Reps is how many times each side of a figure is timed; the best
	// time of each side counts.
	Reps int

	// Size is the large file of seq-read, seq-write and fuse.
	Size int64
	// SmallFiles files of SmallFileSize bytes each for the small-* figures.
	SmallFiles    int
	SmallFileSize int
	// FaultySize is the file of faulty-read and faulty-write; Faulty*
	// configure the injected latency and the per-stream bandwidth cap.
	FaultySize      int64
	FaultyLatency   time.Duration
	FaultyBandwidth int64
	// MemorySize is the file streamed in the memory figure, through a
	// mount with --block-cache-mb BlockCacheMB.
	MemorySize   int64
	BlockCacheMB int64
	// Mounts mount in one process for memory-mounts, each streaming a
	// file of MountFileSize.
	Mounts        int
	MountFileSize int64

	// FewStrategies limits the SDK download strategies tried for
	// seq-read to three (one single-stream and two parallel) instead of
	// seven. seq-write always tries three.
	FewStrategies bool
	// Others measures blobfuse2 and rclone when they are on PATH.
	Others bool
	// DropCaches drops the kernel's page cache before every timed phase.
	DropCaches bool
	// WorkDir holds mountpoints, caches and the local store; a fresh
	// directory under it is removed at the end. Default os.TempDir().
	WorkDir string
	// KeepContainer leaves the Azurite container in place at the end.
	KeepContainer bool
	// FreshAzurite, if set, is a shell command run before every Azurite
	// figure but the first, and before every timed write of seq-write,
	// which must leave an empty Azurite at Endpoint (restart an
	// in-memory one); the container is created again. An in-memory
	// Azurite frees a figure's deleted blobs only in a garbage
	// collection minutes later, which then takes a CPU for tens of
	// seconds in the middle of another figure: seen as a baseline's
	// repetitions taking 4.9, 8.0 and 8.7 s in one row.
	FreshAzurite string
	// Log receives progress lines: every timing as it is taken. Nil
	// discards them.
	Log io.Writer
}

// Sizes.
const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30
)

// DefaultConfig is the full run the issue asks for.
func DefaultConfig() Config {
	return Config{
		Endpoint:        "http://127.0.0.1:10000/" + blobstore.AzuriteAccount,
		Key:             blobstore.AzuriteAccountKey,
		BlobfsBin:       "bin/blobfs",
		Figures:         DefaultFigureIDs(),
		Reps:            3,
		Size:            1 * GiB,
		SmallFiles:      1000,
		SmallFileSize:   4 * KiB,
		FaultySize:      256 * MiB,
		FaultyLatency:   20 * time.Millisecond,
		FaultyBandwidth: 32 * MiB,
		MemorySize:      4 * GiB,
		BlockCacheMB:    256,
		Mounts:          50,
		MountFileSize:   128 * MiB,
		Others:          true,
		DropCaches:      os.Geteuid() == 0,
	}
}

// QuickConfig is a smoke run: 64 MiB files, 100 small files, one
// repetition, three SDK strategies, a memory figure whose file is four
// times the block cache. It takes well under a minute.
func QuickConfig() Config {
	c := DefaultConfig()
	c.Reps = 1
	c.Size = 64 * MiB
	c.SmallFiles = 100
	c.FaultySize = 32 * MiB
	c.MemorySize = 128 * MiB
	c.BlockCacheMB = 32
	c.Mounts = 8
	c.MountFileSize = 32 * MiB
	c.FewStrategies = true
	return c
}

// validate checks c and fills in what can be derived.
func (c *Config) validate() error {
	if len(c.Figures) == 0 {
		return errors.New("bench: no figure selected")
	}
	for _, f := range c.Figures {
		if !slices.Contains(FigureIDs(), f) {
			return fmt.Errorf("bench: unknown figure %q", f)
		}
	}
	if c.Reps < 1 {
		return fmt.Errorf("bench: Reps %d must be at least 1", c.Reps)
	}
	if c.Key == "" {
		c.Key = blobstore.AzuriteAccountKey
	}
	if c.InProcess && (len(c.BlobfsArgs) > 0 || len(c.CompareArgs) > 0) {
		// The in-process mount has fusefs's default options: flags for
		// the binary would be measured as if applied, and are not.
		return errors.New("bench: -inprocess serves blobfs with its default options; -blobfs-args and -compare-args need the binary")
	}
	if c.needsAzurite() && c.Endpoint == "" {
		return errors.New("bench: Endpoint (Azurite's blob endpoint) is required for the Azurite figures")
	}
	if (c.needsAzurite() && !c.InProcess) || c.wants(FigMemory) {
		if c.BlobfsBin == "" {
			return errors.New("bench: BlobfsBin is required (make build puts it at bin/blobfs)")
		}
		if _, err := os.Stat(c.BlobfsBin); err != nil {
			return fmt.Errorf("bench: blobfs binary: %w (run make build)", err)
		}
	}
	for _, s := range []struct {
		name     string
		v, least int64
	}{
		{"Size", c.Size, MiB},
		{"FaultySize", c.FaultySize, MiB},
		{"MemorySize", c.MemorySize, MiB},
		{"SmallFiles", int64(c.SmallFiles), 1},
		{"SmallFileSize", int64(c.SmallFileSize), 1},
		{"BlockCacheMB", c.BlockCacheMB, 8},
		{"Mounts", int64(c.Mounts), 1},
		{"MountFileSize", c.MountFileSize, MiB},
	} {
		if s.v < s.least {
			return fmt.Errorf("bench: %s %d is below %d", s.name, s.v, s.least)
		}
	}
	if c.Log == nil {
		c.Log = io.Discard
	}
	if c.WorkDir == "" {
		c.WorkDir = os.TempDir()
	}
	return nil
}

func (c *Config) wants(fig string) bool { return slices.Contains(c.Figures, fig) }

func (c *Config) needsAzurite() bool {
	return slices.ContainsFunc(c.Figures, func(f string) bool { return slices.Contains(azuriteFigures, f) })
}

// azuriteWrites estimates how many bytes a run writes to Azurite. An
// in-memory Azurite keeps them all until its garbage collection (every 10
// minutes), deletions included, and refuses writes past its memory limit
// (half the machine's memory by default).
func (c *Config) azuriteWrites(clients int) int64 {
	var n int64
	if c.wants(FigSeqRead) {
		n += c.Size
	}
	if c.wants(FigSeqReadWarm) {
		n += c.Size * (blobfsCacheBytes(c.BlobfsArgs)/c.Size + 2)
	}
	for _, f := range []string{FigSeqWrite, FigSeqWriteOwnCPU} {
		if c.wants(f) {
			n += c.Size * int64(uploadStrategyCount+c.Reps*(1+clients))
		}
	}
	small := int64(c.SmallFiles) * int64(c.SmallFileSize)
	if c.wants(FigSmallCreate) {
		n += small * int64(1+c.Reps*(1+clients))
	}
	if c.wants(FigSmallList) || c.wants(FigSmallRead) {
		n += small
	}
	return n
}

// Package fsmetrics is the Prometheus metrics of blobfs mounts, shared by
// `blobfs mount` and the CSI driver: FUSE operations and store requests
// (counted and timed), bytes through each layer, and per-volume gauges of
// what each mount holds that the store does not have yet.
//
// Cardinality: label values come from small fixed sets (operation names,
// errno names, result kinds), and the volume label has one value per live
// mount (a CSI volume id, or a standalone mount's mountpoint); a volume's
// series go when its mount ends. Names and labels are listed in
// docs/reference.md.
package fsmetrics

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sys/unix"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// Metrics are the mount metrics, on a registry of their own (no global
// state: tests run several in one process).
type Metrics struct {
	Registry *prometheus.Registry

	fuseOps      *prometheus.CounterVec   // op, result
	fuseLatency  *prometheus.HistogramVec // op
	storeReqs    *prometheus.CounterVec   // op, result
	storeLat     *prometheus.HistogramVec // op
	bytes        *prometheus.CounterVec   // layer, direction
	restartPause prometheus.Histogram

	mu        sync.Mutex
	cacheHits uint64 // of filesystems already untracked; guarded by mu
	cacheMiss uint64 // guarded by mu
	volumes   map[*fusefs.FS]*volume
}

// volume is one tracked mount.
type volume struct {
	name     string
	inFlight *atomic.Int64 // store requests under way
	oldest   func() time.Duration
}

// LatencyBuckets are the buckets of every latency histogram, in seconds.
var LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}

// New makes the metrics and registers them, with the Go runtime and process
// collectors, on a new registry.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		fuseOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_fuse_operations_total", Help: "FUSE operations served, by operation and result (ok or an errno name).",
		}, []string{"op", "result"}),
		fuseLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "blobfs_fuse_operation_duration_seconds", Help: "Latency of FUSE operations.", Buckets: LatencyBuckets,
		}, []string{"op"}),
		storeReqs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_store_requests_total", Help: "Blob store requests (each try), by operation and result.",
		}, []string{"op", "result"}),
		storeLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "blobfs_store_request_duration_seconds", Help: "Latency of blob store requests.", Buckets: LatencyBuckets,
		}, []string{"op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_bytes_total", Help: "Bytes read and written, through the mounts (layer fuse) and to the store (layer store).",
		}, []string{"layer", "direction"}),
		restartPause: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "blobfs_restart_pause_seconds",
			Help:    "How long a mount went unserved while the process serving it restarted: from the old one's end to the new one serving it, per mount.",
			Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 30, 60, 120},
		}),
		volumes: map[*fusefs.FS]*volume{},
	}
	m.Registry.MustRegister(m.fuseOps, m.fuseLatency, m.storeReqs, m.storeLat, m.bytes, m.restartPause,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "blobfs_cache_hits_total", Help: "Block cache hits over every mount of this process.",
	}, func() float64 { h, _ := m.cacheStats(); return float64(h) }))
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "blobfs_cache_misses_total", Help: "Block cache misses over every mount of this process.",
	}, func() float64 { _, x := m.cacheStats(); return float64(x) }))
	m.Registry.MustRegister(volumeCollector{m})
	for _, l := range []string{"fuse", "store"} {
		for _, d := range []string{"read", "write"} {
			m.bytes.WithLabelValues(l, d) // present at 0 from the start
		}
	}
	return m
}

// Serve serves the registry at http://addr/metrics until Close of the
// returned server. A listen error (address in use) is returned at once.
func (m *Metrics) Serve(addr string) (*http.Server, net.Addr, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, nil, err
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return srv, l.Addr(), nil
}

// ObserveRestartPause records how long a mount went unserved across a
// restart of its server.
func (m *Metrics) ObserveRestartPause(d time.Duration) { m.restartPause.Observe(d.Seconds()) }

// --- volumes -----------------------------------------------------------

// Volume registers a mount under the volume label name, before its
// filesystem exists: the store it is given (InstrumentStore) counts its
// requests in flight from the first one. Track binds it to the
// filesystem; Untrack ends it.
type Volume struct {
	m    *Metrics
	name string
	in   atomic.Int64

	oldest func() time.Duration // set by WatchStore before Track
}

// NewVolume starts a volume's metrics.
func (m *Metrics) NewVolume(name string) *Volume { return &Volume{m: m, name: name} }

// Track reports fs's gauges under the volume's label until Untrack.
func (v *Volume) Track(fs *fusefs.FS) {
	v.m.mu.Lock()
	defer v.m.mu.Unlock()
	v.m.volumes[fs] = &volume{name: v.name, inFlight: &v.in, oldest: v.oldest}
}

// WatchStore reports the age of the oldest request in flight through w as
// the volume's blobfs_volume_store_oldest_request_seconds. Call it before
// Track.
func (v *Volume) WatchStore(w *blobstore.Watched) { v.oldest = w.Oldest }

// Untrack ends fs's series, keeping its cache counts in the totals.
func (m *Metrics) Untrack(fs *fusefs.FS) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.volumes[fs]; !ok {
		return
	}
	h, x := fs.CacheStats()
	m.cacheHits += h
	m.cacheMiss += x
	delete(m.volumes, fs)
}

func (m *Metrics) cacheStats() (hits, misses uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	hits, misses = m.cacheHits, m.cacheMiss
	for fs := range m.volumes {
		h, x := fs.CacheStats()
		hits += h
		misses += x
	}
	return hits, misses
}

// volumeCollector reports each tracked mount's gauges at scrape time.
type volumeCollector struct{ m *Metrics }

var (
	volDirtyFiles = prometheus.NewDesc("blobfs_volume_dirty_files", "Open files with changes the store does not have yet.", []string{"volume"}, nil)
	volDirty      = prometheus.NewDesc("blobfs_volume_dirty_bytes", "Sizes of the open files with changes the store does not have yet.", []string{"volume"}, nil)
	volUploading  = prometheus.NewDesc("blobfs_volume_uploading_bytes", "Bytes still to upload: blocks in flight while files stream, and what the uploads under way (close, fsync, rename, write-back) have still to send.", []string{"volume"}, nil)
	volSpill      = prometheus.NewDesc("blobfs_volume_spill_bytes", "Disk space taken by the spill files of open files, in the cache directory.", []string{"volume"}, nil)
	volCache      = prometheus.NewDesc("blobfs_volume_cache_bytes", "Memory of the read block cache.", []string{"volume"}, nil)
	volInFlight   = prometheus.NewDesc("blobfs_volume_store_requests_in_flight", "Store requests under way (each try).", []string{"volume"}, nil)
	volOldest     = prometheus.NewDesc("blobfs_volume_store_oldest_request_seconds", "Age of the oldest store request under way (each try), 0 when none is: a value that keeps growing is a store that does not answer.", []string{"volume"}, nil)
	volHits       = prometheus.NewDesc("blobfs_volume_cache_hits_total", "Reads answered from the block cache.", []string{"volume"}, nil)
	volMisses     = prometheus.NewDesc("blobfs_volume_cache_misses_total", "Reads that had to fetch from the store.", []string{"volume"}, nil)
	volRead       = prometheus.NewDesc("blobfs_volume_read_bytes_total", "Bytes that reads returned from the store's content.", []string{"volume"}, nil)
	volFetched    = prometheus.NewDesc("blobfs_volume_read_fetched_bytes_total", "Bytes downloaded for reads (blocks, read-ahead, prefetched files, random reads' chunks, files fetched whole into the disk cache); divided by blobfs_volume_read_bytes_total, the read amplification.", []string{"volume"}, nil)
	volDiskRead   = prometheus.NewDesc("blobfs_volume_disk_cache_read_bytes_total", "Bytes the mount read from the disk cache instead of the store.", []string{"volume"}, nil)
	volWriteBack  = prometheus.NewDesc("blobfs_volume_write_back_bytes", "Sizes of the closed files whose upload runs in the background (write-back).", []string{"volume"}, nil)
	volKept       = prometheus.NewDesc("blobfs_volume_uploads_kept_total", "Files whose data could not be uploaded and was kept in the cache directory's lost+found.", []string{"volume"}, nil)
	volVerified   = prometheus.NewDesc("blobfs_volume_content_verified_total", "Whole reads of blobs whose content matched their Content-MD5.", []string{"volume"}, nil)
	volMismatch   = prometheus.NewDesc("blobfs_volume_content_mismatches_total", "Whole reads of blobs whose content did not match their Content-MD5; their reads failed with EIO.", []string{"volume"}, nil)
	volReused     = prometheus.NewDesc("blobfs_volume_upload_reused_bytes_total", "Bytes that commits did not upload again: full blocks of the file's previous commit, named in the new block list (a file fsync'ed as it grows).", []string{"volume"}, nil)
	volPassOpens  = prometheus.NewDesc("blobfs_volume_passthrough_opens_total", "Opens of files held whole in the disk cache that the kernel reads itself (FUSE passthrough).", []string{"volume"}, nil)
)

func (c volumeCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{volDirtyFiles, volDirty, volUploading, volSpill, volCache, volInFlight, volOldest, volHits, volMisses, volRead, volFetched, volDiskRead, volPassOpens, volWriteBack, volKept, volVerified, volMismatch, volReused} {
		ch <- d
	}
}

func (c volumeCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	vols := make(map[*fusefs.FS]*volume, len(c.m.volumes))
	for fs, v := range c.m.volumes {
		vols[fs] = v
	}
	c.m.mu.Unlock()
	for fs, v := range vols {
		s := fs.Stats()
		gauge := func(d *prometheus.Desc, x float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, x, v.name)
		}
		gauge(volDirtyFiles, float64(s.DirtyFiles))
		gauge(volDirty, float64(s.DirtyBytes))
		gauge(volUploading, float64(s.UploadingBytes))
		gauge(volSpill, float64(s.SpillBytes))
		gauge(volCache, float64(s.CacheBytes))
		gauge(volInFlight, float64(v.inFlight.Load()))
		if v.oldest != nil {
			gauge(volOldest, v.oldest().Seconds())
		}
		ch <- prometheus.MustNewConstMetric(volHits, prometheus.CounterValue, float64(s.CacheHits), v.name)
		ch <- prometheus.MustNewConstMetric(volMisses, prometheus.CounterValue, float64(s.CacheMisses), v.name)
		ch <- prometheus.MustNewConstMetric(volRead, prometheus.CounterValue, float64(s.ReadBytes), v.name)
		ch <- prometheus.MustNewConstMetric(volFetched, prometheus.CounterValue, float64(s.FetchedBytes), v.name)
		ch <- prometheus.MustNewConstMetric(volDiskRead, prometheus.CounterValue, float64(s.DiskReadBytes), v.name)
		ch <- prometheus.MustNewConstMetric(volPassOpens, prometheus.CounterValue, float64(s.PassthroughOpens), v.name)
		gauge(volWriteBack, float64(s.WriteBackBytes))
		ch <- prometheus.MustNewConstMetric(volKept, prometheus.CounterValue, float64(s.KeptFiles), v.name)
		ch <- prometheus.MustNewConstMetric(volVerified, prometheus.CounterValue, float64(s.ContentVerified), v.name)
		ch <- prometheus.MustNewConstMetric(volMismatch, prometheus.CounterValue, float64(s.ContentMismatches), v.name)
		ch <- prometheus.MustNewConstMetric(volReused, prometheus.CounterValue, float64(s.ReusedBytes), v.name)
	}
}

// --- store requests ----------------------------------------------------

// InstrumentStore counts and times every request to the store below it,
// and the bytes read and (successfully) written, and the volume's requests
// in flight. It belongs under the retry layer, so each try is one request.
func (v *Volume) InstrumentStore(s blobstore.Store) blobstore.Store {
	m := v.m
	return blobstore.NewObservedFrom(s, func(context.Context, blobstore.Op) { v.in.Add(1) }, func(_ context.Context, c *blobstore.Call) {
		v.in.Add(-1)
		m.storeReqs.WithLabelValues(string(c.Op), storeResult(c.Err)).Inc()
		m.storeLat.WithLabelValues(string(c.Op)).Observe(c.Took.Seconds())
		switch {
		case c.Op == blobstore.OpReadAt:
			m.bytes.WithLabelValues("store", "read").Add(float64(c.Read))
		case (c.Op == blobstore.OpPut || c.Op == blobstore.OpStageBlock) && c.Err == nil:
			m.bytes.WithLabelValues("store", "write").Add(float64(c.Len))
		}
	})
}

// storeResult names an error's kind from the blobstore sentinels.
func storeResult(err error) string {
	switch {
	case err == nil || errors.Is(err, io.EOF):
		return "ok"
	case errors.Is(err, blobstore.ErrNotFound):
		return "not_found"
	case errors.Is(err, blobstore.ErrPreconditionFailed):
		return "precondition_failed"
	case errors.Is(err, blobstore.ErrAlreadyExists):
		return "already_exists"
	case errors.Is(err, blobstore.ErrThrottled):
		return "throttled"
	case errors.Is(err, blobstore.ErrUnauthorized):
		return "unauthorized"
	case errors.Is(err, blobstore.ErrTransient):
		return "transient"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "canceled"
	}
	return "error"
}

// InstrumentFS returns fs with its FUSE operations counted and timed.
func (m *Metrics) InstrumentFS(fs *fusefs.FS) fuse.RawFileSystem { return instrumentedFS{FS: fs, m: m} }

// --- FUSE operations ---------------------------------------------------

// instrumentedFS counts and times the FUSE operations of one mount. It
// embeds the filesystem, so operations not listed here pass through
// uncounted (rare ones: locks, ioctl, lseek).
type instrumentedFS struct {
	*fusefs.FS
	m *Metrics
}

var _ fuse.RawFileSystem = instrumentedFS{}

// count runs one operation, and counts and times it as op.
func (f instrumentedFS) count(op string, call func() fuse.Status) fuse.Status {
	start := time.Now()
	st := call()
	f.done(op, start, st)
	return st
}

func (f instrumentedFS) done(op string, start time.Time, st fuse.Status) {
	res := "ok"
	if st != fuse.OK {
		res = unix.ErrnoName(syscall.Errno(st))
		if res == "" {
			res = "error"
		}
	}
	f.m.fuseOps.WithLabelValues(op, res).Inc()
	f.m.fuseLatency.WithLabelValues(op).Observe(time.Since(start).Seconds())
}

func (f instrumentedFS) Lookup(c <-chan struct{}, h *fuse.InHeader, name string, out *fuse.EntryOut) fuse.Status {
	return f.count("lookup", func() fuse.Status { return f.FS.Lookup(c, h, name, out) })
}

func (f instrumentedFS) GetAttr(c <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	return f.count("getattr", func() fuse.Status { return f.FS.GetAttr(c, in, out) })
}

func (f instrumentedFS) SetAttr(c <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	return f.count("setattr", func() fuse.Status { return f.FS.SetAttr(c, in, out) })
}

func (f instrumentedFS) Mknod(c <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	return f.count("mknod", func() fuse.Status { return f.FS.Mknod(c, in, name, out) })
}

func (f instrumentedFS) Mkdir(c <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	return f.count("mkdir", func() fuse.Status { return f.FS.Mkdir(c, in, name, out) })
}

func (f instrumentedFS) Unlink(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return f.count("unlink", func() fuse.Status { return f.FS.Unlink(c, h, name) })
}

func (f instrumentedFS) Rmdir(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	return f.count("rmdir", func() fuse.Status { return f.FS.Rmdir(c, h, name) })
}

func (f instrumentedFS) Rename(c <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	return f.count("rename", func() fuse.Status { return f.FS.Rename(c, in, oldName, newName) })
}

func (f instrumentedFS) Symlink(c <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	return f.count("symlink", func() fuse.Status { return f.FS.Symlink(c, h, target, name, out) })
}

func (f instrumentedFS) Readlink(c <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	var b []byte
	st := f.count("readlink", func() (st fuse.Status) { b, st = f.FS.Readlink(c, h); return st })
	return b, st
}

func (f instrumentedFS) Create(c <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	return f.count("create", func() fuse.Status { return f.FS.Create(c, in, name, out) })
}

func (f instrumentedFS) Open(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return f.count("open", func() fuse.Status { return f.FS.Open(c, in, out) })
}

func (f instrumentedFS) Read(c <-chan struct{}, in *fuse.ReadIn, buf []byte) (fuse.ReadResult, fuse.Status) {
	t := time.Now()
	r, st := f.FS.Read(c, in, buf)
	f.done("read", t, st)
	if st == fuse.OK && r != nil {
		f.m.bytes.WithLabelValues("fuse", "read").Add(float64(r.Size()))
	}
	return r, st
}

func (f instrumentedFS) Write(c <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	t := time.Now()
	n, st := f.FS.Write(c, in, data)
	f.done("write", t, st)
	f.m.bytes.WithLabelValues("fuse", "write").Add(float64(n))
	return n, st
}

func (f instrumentedFS) Flush(c <-chan struct{}, in *fuse.FlushIn) fuse.Status {
	return f.count("flush", func() fuse.Status { return f.FS.Flush(c, in) })
}

func (f instrumentedFS) Fsync(c <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	return f.count("fsync", func() fuse.Status { return f.FS.Fsync(c, in) })
}

func (f instrumentedFS) Release(c <-chan struct{}, in *fuse.ReleaseIn) {
	t := time.Now()
	f.FS.Release(c, in)
	f.done("release", t, fuse.OK)
}

func (f instrumentedFS) OpenDir(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	return f.count("opendir", func() fuse.Status { return f.FS.OpenDir(c, in, out) })
}

func (f instrumentedFS) ReadDir(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.count("readdir", func() fuse.Status { return f.FS.ReadDir(c, in, out) })
}

func (f instrumentedFS) ReadDirPlus(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	return f.count("readdirplus", func() fuse.Status { return f.FS.ReadDirPlus(c, in, out) })
}

func (f instrumentedFS) StatFs(c <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	return f.count("statfs", func() fuse.Status { return f.FS.StatFs(c, h, out) })
}

// The extended attribute calls are counted too: blobfs answers ENOSYS,
// after which the kernel sends none; a count that grows shows otherwise.
func (f instrumentedFS) GetXAttr(c <-chan struct{}, h *fuse.InHeader, attr string, dest []byte) (uint32, fuse.Status) {
	var n uint32
	st := f.count("getxattr", func() (st fuse.Status) { n, st = f.FS.GetXAttr(c, h, attr, dest); return st })
	return n, st
}

func (f instrumentedFS) ListXAttr(c <-chan struct{}, h *fuse.InHeader, dest []byte) (uint32, fuse.Status) {
	var n uint32
	st := f.count("listxattr", func() (st fuse.Status) { n, st = f.FS.ListXAttr(c, h, dest); return st })
	return n, st
}

package csi

import (
	"context"
	"errors"
	"io"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/blobstore"
	"github.com/blobfs/blobfs/fusefs"
)

// Metrics are the driver's Prometheus metrics, on a registry of its own
// (no global state: tests run several drivers in one process). Names and
// labels are listed in docs/reference.md. Label values come from small fixed
// sets (method names, operation names, errno names, result kinds), never
// from volume ids or paths, so cardinality stays bounded.
type Metrics struct {
	Registry *prometheus.Registry

	csiCalls    *prometheus.CounterVec   // method, code
	csiLatency  *prometheus.HistogramVec // method
	fuseOps     *prometheus.CounterVec   // op, result
	fuseLatency *prometheus.HistogramVec // op
	storeReqs   *prometheus.CounterVec   // op, result
	storeLat    *prometheus.HistogramVec // op
	bytes       *prometheus.CounterVec   // layer, direction

	mu         sync.Mutex
	cacheHits  uint64 // of filesystems already closed; guarded by mu
	cacheMiss  uint64 // guarded by mu
	cacheLive  map[*fusefs.FS]struct{}
	mountsFunc func() map[string]int // state -> count
}

// NewMetrics makes the metrics and registers them, with the Go runtime and
// process collectors, on a new registry.
func NewMetrics() *Metrics {
	lat := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60}
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		csiCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_csi_requests_total", Help: "CSI calls by method and gRPC status code.",
		}, []string{"method", "code"}),
		csiLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "blobfs_csi_request_duration_seconds", Help: "Latency of CSI calls.", Buckets: lat,
		}, []string{"method"}),
		fuseOps: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_fuse_operations_total", Help: "FUSE operations served, by operation and result (ok or an errno name).",
		}, []string{"op", "result"}),
		fuseLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "blobfs_fuse_operation_duration_seconds", Help: "Latency of FUSE operations.", Buckets: lat,
		}, []string{"op"}),
		storeReqs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_store_requests_total", Help: "Blob store requests (each try), by operation and result.",
		}, []string{"op", "result"}),
		storeLat: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "blobfs_store_request_duration_seconds", Help: "Latency of blob store requests.", Buckets: lat,
		}, []string{"op"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_bytes_total", Help: "Bytes read and written, through the mounts (layer fuse) and to the store (layer store).",
		}, []string{"layer", "direction"}),
		cacheLive: map[*fusefs.FS]struct{}{},
	}
	m.Registry.MustRegister(m.csiCalls, m.csiLatency, m.fuseOps, m.fuseLatency, m.storeReqs, m.storeLat, m.bytes,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "blobfs_cache_hits_total", Help: "Block cache hits over every mount.",
	}, func() float64 { h, _ := m.cacheStats(); return float64(h) }))
	m.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "blobfs_cache_misses_total", Help: "Block cache misses over every mount.",
	}, func() float64 { _, x := m.cacheStats(); return float64(x) }))
	m.Registry.MustRegister(mountsCollector{m})
	for _, l := range []string{"fuse", "store"} {
		for _, d := range []string{"read", "write"} {
			m.bytes.WithLabelValues(l, d) // present at 0 from the start
		}
	}
	return m
}

// mountsCollector reports blobfs_mounts{state} from the node state at
// scrape time.
type mountsCollector struct{ m *Metrics }

var mountsDesc = prometheus.NewDesc("blobfs_mounts", "Volumes on this node by state: staged, published (targets), ephemeral, unhealthy.", []string{"state"}, nil)

func (c mountsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- mountsDesc }

func (c mountsCollector) Collect(ch chan<- prometheus.Metric) {
	c.m.mu.Lock()
	f := c.m.mountsFunc
	c.m.mu.Unlock()
	counts := map[string]int{"staged": 0, "published": 0, "ephemeral": 0, "unhealthy": 0}
	if f != nil {
		for k, v := range f() {
			counts[k] = v
		}
	}
	for state, n := range counts {
		ch <- prometheus.MustNewConstMetric(mountsDesc, prometheus.GaugeValue, float64(n), state)
	}
}

func (m *Metrics) setMountsFunc(f func() map[string]int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.mountsFunc = f
}

func (m *Metrics) cacheStats() (hits, misses uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	hits, misses = m.cacheHits, m.cacheMiss
	for fs := range m.cacheLive {
		h, x := fs.CacheStats()
		hits += h
		misses += x
	}
	return hits, misses
}

// trackFS counts fs's cache statistics until untrackFS.
func (m *Metrics) trackFS(fs *fusefs.FS) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.cacheLive[fs] = struct{}{}
}

// untrackFS keeps the final counts of a filesystem being closed.
func (m *Metrics) untrackFS(fs *fusefs.FS) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, x := fs.CacheStats()
	m.cacheHits += h
	m.cacheMiss += x
	delete(m.cacheLive, fs)
}

func (m *Metrics) observeCSI(method string, err error, d time.Duration) {
	m.csiCalls.WithLabelValues(method, status.Code(err).String()).Inc()
	m.csiLatency.WithLabelValues(method).Observe(d.Seconds())
}

// --- store requests ----------------------------------------------------

// instrumentStore counts and times every request to the store below it,
// and the bytes read and (successfully) written. It sits under the retry
// layer, so each try is one request.
func (m *Metrics) instrumentStore(s blobstore.Store) blobstore.Store {
	return blobstore.NewObserved(s, func(_ context.Context, c *blobstore.Call) {
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

// --- FUSE operations ---------------------------------------------------

// instrumentedFS counts and times the FUSE operations of one mount. It
// embeds the filesystem, so operations not listed here pass through
// uncounted (rare ones: locks, ioctl, lseek).
type instrumentedFS struct {
	*fusefs.FS
	m *Metrics
}

var _ fuse.RawFileSystem = instrumentedFS{}

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
	t := time.Now()
	st := f.FS.Lookup(c, h, name, out)
	f.done("lookup", t, st)
	return st
}

func (f instrumentedFS) GetAttr(c <-chan struct{}, in *fuse.GetAttrIn, out *fuse.AttrOut) fuse.Status {
	t := time.Now()
	st := f.FS.GetAttr(c, in, out)
	f.done("getattr", t, st)
	return st
}

func (f instrumentedFS) SetAttr(c <-chan struct{}, in *fuse.SetAttrIn, out *fuse.AttrOut) fuse.Status {
	t := time.Now()
	st := f.FS.SetAttr(c, in, out)
	f.done("setattr", t, st)
	return st
}

func (f instrumentedFS) Mknod(c <-chan struct{}, in *fuse.MknodIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := f.FS.Mknod(c, in, name, out)
	f.done("mknod", t, st)
	return st
}

func (f instrumentedFS) Mkdir(c <-chan struct{}, in *fuse.MkdirIn, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := f.FS.Mkdir(c, in, name, out)
	f.done("mkdir", t, st)
	return st
}

func (f instrumentedFS) Unlink(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t := time.Now()
	st := f.FS.Unlink(c, h, name)
	f.done("unlink", t, st)
	return st
}

func (f instrumentedFS) Rmdir(c <-chan struct{}, h *fuse.InHeader, name string) fuse.Status {
	t := time.Now()
	st := f.FS.Rmdir(c, h, name)
	f.done("rmdir", t, st)
	return st
}

func (f instrumentedFS) Rename(c <-chan struct{}, in *fuse.RenameIn, oldName, newName string) fuse.Status {
	t := time.Now()
	st := f.FS.Rename(c, in, oldName, newName)
	f.done("rename", t, st)
	return st
}

func (f instrumentedFS) Symlink(c <-chan struct{}, h *fuse.InHeader, target, name string, out *fuse.EntryOut) fuse.Status {
	t := time.Now()
	st := f.FS.Symlink(c, h, target, name, out)
	f.done("symlink", t, st)
	return st
}

func (f instrumentedFS) Readlink(c <-chan struct{}, h *fuse.InHeader) ([]byte, fuse.Status) {
	t := time.Now()
	b, st := f.FS.Readlink(c, h)
	f.done("readlink", t, st)
	return b, st
}

func (f instrumentedFS) Create(c <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	t := time.Now()
	st := f.FS.Create(c, in, name, out)
	f.done("create", t, st)
	return st
}

func (f instrumentedFS) Open(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t := time.Now()
	st := f.FS.Open(c, in, out)
	f.done("open", t, st)
	return st
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
	t := time.Now()
	st := f.FS.Flush(c, in)
	f.done("flush", t, st)
	return st
}

func (f instrumentedFS) Fsync(c <-chan struct{}, in *fuse.FsyncIn) fuse.Status {
	t := time.Now()
	st := f.FS.Fsync(c, in)
	f.done("fsync", t, st)
	return st
}

func (f instrumentedFS) Release(c <-chan struct{}, in *fuse.ReleaseIn) {
	t := time.Now()
	f.FS.Release(c, in)
	f.done("release", t, fuse.OK)
}

func (f instrumentedFS) OpenDir(c <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	t := time.Now()
	st := f.FS.OpenDir(c, in, out)
	f.done("opendir", t, st)
	return st
}

func (f instrumentedFS) ReadDir(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t := time.Now()
	st := f.FS.ReadDir(c, in, out)
	f.done("readdir", t, st)
	return st
}

func (f instrumentedFS) ReadDirPlus(c <-chan struct{}, in *fuse.ReadIn, out *fuse.DirEntryList) fuse.Status {
	t := time.Now()
	st := f.FS.ReadDirPlus(c, in, out)
	f.done("readdirplus", t, st)
	return st
}

func (f instrumentedFS) StatFs(c <-chan struct{}, h *fuse.InHeader, out *fuse.StatfsOut) fuse.Status {
	t := time.Now()
	st := f.FS.StatFs(c, h, out)
	f.done("statfs", t, st)
	return st
}

package csi

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/status"

	"github.com/blobfs/blobfs/fusefs/fsmetrics"
)

// Metrics are the driver's Prometheus metrics: those of its mounts
// (fsmetrics: FUSE operations, store requests, per-volume gauges, restart
// pauses) and its own (CSI calls, volumes by state), on one registry of
// their own (no global state: tests run several drivers in one process).
// Names and labels are listed in docs/reference.md. Label values come from
// small fixed sets (method names, gRPC codes, states) or, for per-volume
// series, from the volumes mounted on the node, whose series end with
// their mounts.
type Metrics struct {
	*fsmetrics.Metrics

	csiCalls   *prometheus.CounterVec   // method, code
	csiLatency *prometheus.HistogramVec // method
	// viewRepairs counts running containers' mounts of dead connections
	// replaced (or not) after a repair (views.go).
	viewRepairs *prometheus.CounterVec // result
	// driverRestarts counts restarts in place (blobfs csi
	// --restart-in-place) before this process.
	driverRestarts prometheus.Counter

	mu         sync.Mutex
	mountsFunc func() map[string]int // state -> count; guarded by mu
}

// NewMetrics makes the metrics and registers them, with the Go runtime and
// process collectors, on a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		Metrics: fsmetrics.New(),
		csiCalls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_csi_requests_total", Help: "CSI calls by method and gRPC status code.",
		}, []string{"method", "code"}),
		csiLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "blobfs_csi_request_duration_seconds", Help: "Latency of CSI calls.", Buckets: fsmetrics.LatencyBuckets,
		}, []string{"method"}),
		viewRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "blobfs_csi_container_views_repaired_total",
			Help: "Running containers' mounts of a dead FUSE connection, replaced in place by a working mount (result=replaced) or not (result=failed).",
		}, []string{"result"}),
		driverRestarts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "blobfs_csi_driver_restarts_total",
			Help: "Times the driver process died and was started again in place by its supervisor (blobfs csi --restart-in-place) since the container started.",
		}),
	}
	m.Registry.MustRegister(m.csiCalls, m.csiLatency, m.viewRepairs, m.driverRestarts, mountsCollector{m})
	return m
}

// CountDriverRestarts adds the restarts in place that came before this
// process.
func (m *Metrics) CountDriverRestarts(n int) { m.driverRestarts.Add(float64(n)) }

// countViewRepairs adds the outcome of one ReplaceDeadViews.
func (m *Metrics) countViewRepairs(r ViewRepair) {
	m.viewRepairs.WithLabelValues("replaced").Add(float64(r.Replaced))
	m.viewRepairs.WithLabelValues("failed").Add(float64(r.Failed))
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

func (m *Metrics) observeCSI(method string, err error, d time.Duration) {
	m.csiCalls.WithLabelValues(method, status.Code(err).String()).Inc()
	m.csiLatency.WithLabelValues(method).Observe(d.Seconds())
}

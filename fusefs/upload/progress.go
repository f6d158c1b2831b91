package upload

import (
	"log/slog"
	"sync/atomic"
	"time"
)

// Upload progress: an upload that a close or fsync waits for can take
// minutes (a large file written out of order is uploaded whole at close),
// and an application blocked in close(2) with nothing in the log looks
// hung. An upload still running after ProgressEvery logs its progress at
// info every ProgressEvery (bytes, rate, time left) and once when it ends;
// shorter ones log nothing.

// ProgressEvery is how often a long upload reports; a variable for tests.
var ProgressEvery = 5 * time.Second

// Progress watches one upload (StartProgress).
type Progress struct {
	log   *slog.Logger
	path  string
	size  int64
	start time.Time
	done  atomic.Int64
	stop  chan struct{}
	ended chan struct{} // closed when watch returns
	// reported is set once a progress line was logged, so that the end
	// is logged too.
	reported atomic.Bool
}

// StartProgress begins watching an upload of size bytes of path.
func (u *Uploader) StartProgress(path string, size int64) *Progress {
	p := &Progress{log: u.Log, path: path, size: size, start: time.Now(), stop: make(chan struct{}), ended: make(chan struct{})}
	go p.watch()
	return p
}

// Done is the bytes that reached the store so far.
func (p *Progress) Done() int64 { return p.done.Load() }

// Add counts bytes that reached the store; safe for concurrent use.
func (p *Progress) Add(n int64) { p.done.Add(n) }

func (p *Progress) watch() {
	t := time.NewTicker(ProgressEvery)
	defer t.Stop()
	defer close(p.ended)
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			done := p.done.Load()
			took := time.Since(p.start)
			rate := float64(done) / took.Seconds()
			attrs := []any{"path", p.path, "done_bytes", done, "size_bytes", p.size,
				"rate_mib_s", round2(rate / (1 << 20)), "elapsed", took.Round(time.Second)}
			if rate > 0 {
				attrs = append(attrs, "eta", time.Duration(float64(p.size-done)/rate*float64(time.Second)).Round(time.Second))
			}
			p.reported.Store(true)
			p.log.Info("uploading", attrs...)
		}
	}
}

// Finish ends the watch; an upload that reported progress says how it
// ended.
func (p *Progress) Finish(err error) {
	close(p.stop)
	<-p.ended
	if !p.reported.Load() {
		return
	}
	took := time.Since(p.start)
	if err != nil {
		p.log.Info("upload ended without completing", "path", p.path, "done_bytes", p.done.Load(), "size_bytes", p.size, "elapsed", took.Round(time.Millisecond), "err", err)
		return
	}
	p.log.Info("uploaded", "path", p.path, "size_bytes", p.size, "elapsed", took.Round(time.Millisecond),
		"rate_mib_s", round2(float64(p.size)/took.Seconds()/(1<<20)))
}

func round2(f float64) float64 { return float64(int64(f*100+0.5)) / 100 }

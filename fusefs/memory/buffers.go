package memory

import (
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The block cache's full-size buffers live outside the Go heap, in
// anonymous mappings of their own backed by transparent huge pages where the
// kernel allows them, and populated with one madvise call.
//
// Why: fresh heap memory is faulted in page by page on first write, 2,048
// faults per 8 MiB block. Under this kind of virtualisation a fault costs
// microseconds, so the first 256 MiB a fresh mount read cost a quarter of a
// core: `dd` of a 1 GiB blob from Azurite through a fresh mount took 69,000
// faults and ran at 0.70–0.87 of a second read on the same mount.
// Populated huge-page mappings take 4 faults per block (1.15–1.44× faster
// first reads measured side by side); the Go heap cannot be asked for them
// (the runtime stopped using MADV_HUGEPAGE in Go 1.21.1), and madvise on
// heap ranges would split the runtime's mappings.
//
// The price is explicit freeing: a mapped buffer must be unmapped once and
// never touched again, which the block cache guarantees by freeing only
// buffers no block holds and no fetch or reader has pinned.
//
// Freed buffers wait in a process-wide pool before they are unmapped (at
// most bufPoolMaxBytes, for bufPoolIdle): fresh memory costs 10-14 ms per
// 8 MiB to fault in on these machines even as huge pages, and one process
// serves many mounts that come and go (the CSI driver; the benchmark's
// in-process mounts), so the next mount's cache takes the last one's
// memory instead.
const (
	bufPoolMaxBytes = 1 << 30
	bufPoolIdle     = 30 * time.Second
)

var bufPool struct {
	sync.Mutex
	bySize map[int64][]pooledBuf // oldest first
	bytes  int64
	trim   *time.Timer // pending trimBufPool, nil when the pool is empty
}

type pooledBuf struct {
	buf   []byte
	freed time.Time
}

// mappedBufs records the base address of every mapped buffer, so that a
// buffer that had to fall back to the Go heap is never handed to munmap.
var mappedBufs struct {
	sync.Mutex
	bases map[uintptr]struct{}
}

// AllocBlock returns n bytes whose pages are already faulted in, mapped
// outside the Go heap when possible; they are not zeroed when they come
// from the pool. Free them with FreeBlock.
func AllocBlock(n int64) []byte {
	bufPool.Lock()
	if l := bufPool.bySize[n]; len(l) > 0 {
		// The most recently freed: the likeliest to be in CPU caches.
		buf := l[len(l)-1].buf
		bufPool.bySize[n] = l[:len(l)-1]
		bufPool.bytes -= n
		bufPool.Unlock()
		return buf
	}
	bufPool.Unlock()
	buf, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return FaultedHeap(n)
	}
	// Advice only: where transparent huge pages are off, the buffer
	// gets small pages.
	_ = unix.Madvise(buf, unix.MADV_HUGEPAGE)
	// Populate allocates every page in one call (it fails before Linux
	// 5.14). Touching each page as well costs nothing where it worked
	// with huge pages, and where small pages were mapped it takes the
	// first-access faults now: under paravirtualised paging the guest's
	// populate alone left a 10 ms fault storm per 8 MiB for the first
	// copy into the buffer, measured here.
	_ = unix.Madvise(buf, unix.MADV_POPULATE_WRITE)
	touchPages(buf)
	mappedBufs.Lock()
	if mappedBufs.bases == nil {
		mappedBufs.bases = map[uintptr]struct{}{}
	}
	mappedBufs.bases[Base(buf)] = struct{}{}
	mappedBufs.Unlock()
	return buf
}

// FreeBlock releases a buffer from AllocBlock into the pool; a heap
// fallback is left to the garbage collector.
func FreeBlock(buf []byte) {
	if cap(buf) == 0 {
		return
	}
	buf = buf[:cap(buf)]
	mappedBufs.Lock()
	_, mapped := mappedBufs.bases[Base(buf)]
	mappedBufs.Unlock()
	if !mapped {
		return
	}
	n := int64(len(buf))
	bufPool.Lock()
	defer bufPool.Unlock()
	if bufPool.bytes+n > bufPoolMaxBytes {
		unmapBlockBuf(buf)
		return
	}
	if bufPool.bySize == nil {
		bufPool.bySize = map[int64][]pooledBuf{}
	}
	bufPool.bySize[n] = append(bufPool.bySize[n], pooledBuf{buf, time.Now()})
	bufPool.bytes += n
	if bufPool.trim == nil {
		bufPool.trim = time.AfterFunc(bufPoolIdle, func() { trimBufPool(time.Now()) })
	}
}

// trimBufPool unmaps the buffers idle in the pool for bufPoolIdle at now,
// and schedules itself again for the rest.
func trimBufPool(now time.Time) {
	bufPool.Lock()
	defer bufPool.Unlock()
	next := time.Duration(-1)
	for n, l := range bufPool.bySize {
		i := 0
		for ; i < len(l) && now.Sub(l[i].freed) >= bufPoolIdle; i++ {
			unmapBlockBuf(l[i].buf)
			bufPool.bytes -= n
		}
		l = l[i:]
		if len(l) == 0 {
			delete(bufPool.bySize, n)
			continue
		}
		bufPool.bySize[n] = l
		if wait := bufPoolIdle - now.Sub(l[0].freed); next < 0 || wait < next {
			next = wait
		}
	}
	if bufPool.trim != nil {
		bufPool.trim.Stop()
		bufPool.trim = nil
	}
	if next >= 0 {
		bufPool.trim = time.AfterFunc(next, func() { trimBufPool(time.Now()) })
	}
}

// unmapBlockBuf returns a mapped buffer's memory to the system.
func unmapBlockBuf(buf []byte) {
	mappedBufs.Lock()
	delete(mappedBufs.bases, Base(buf))
	mappedBufs.Unlock()
	if err := unix.Munmap(buf); err != nil {
		panic("blobfs: unmapping a block buffer: " + err.Error())
	}
}

// FaultedHeap allocates a buffer on the Go heap and faults its pages
// in, so that the cost lands where the caller chose (off the READ path).
func FaultedHeap(n int64) []byte {
	buf := make([]byte, n)
	touchPages(buf)
	return buf
}

func touchPages(buf []byte) {
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 0
	}
}

// Base is the address of buf's first byte: a buffer's identity.
func Base(buf []byte) uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
}

// BlocksInUse counts the mapped block buffers handed out and not yet freed
// (those waiting in the pool are not counted): a leak shows here.
func BlocksInUse() int {
	mappedBufs.Lock()
	n := len(mappedBufs.bases)
	mappedBufs.Unlock()
	bufPool.Lock()
	defer bufPool.Unlock()
	for _, l := range bufPool.bySize {
		n -= len(l)
	}
	return n
}

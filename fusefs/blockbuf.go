package fusefs

import (
	"sync"
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

// mappedBufs records the base address of every mapped buffer, so that a
// buffer that had to fall back to the Go heap is never handed to munmap.
var mappedBufs struct {
	sync.Mutex
	bases map[uintptr]struct{}
}

// allocBlockBuf returns n zeroed bytes whose pages are already faulted in,
// mapped outside the Go heap when possible. Free it with freeBlockBuf.
func allocBlockBuf(n int64) []byte {
	buf, err := unix.Mmap(-1, 0, int(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return faultedHeapBuf(n)
	}
	// Advice only: where transparent huge pages are off, populate
	// still faults the pages in, one syscall for all.
	_ = unix.Madvise(buf, unix.MADV_HUGEPAGE)
	if unix.Madvise(buf, unix.MADV_POPULATE_WRITE) != nil {
		// Before Linux 5.14: touch each page instead.
		touchPages(buf)
	}
	mappedBufs.Lock()
	if mappedBufs.bases == nil {
		mappedBufs.bases = map[uintptr]struct{}{}
	}
	mappedBufs.bases[bufBase(buf)] = struct{}{}
	mappedBufs.Unlock()
	return buf
}

// freeBlockBuf releases a buffer from allocBlockBuf; a heap fallback is
// left to the garbage collector.
func freeBlockBuf(buf []byte) {
	if cap(buf) == 0 {
		return
	}
	buf = buf[:cap(buf)]
	base := bufBase(buf)
	mappedBufs.Lock()
	_, mapped := mappedBufs.bases[base]
	delete(mappedBufs.bases, base)
	mappedBufs.Unlock()
	if mapped {
		if err := unix.Munmap(buf); err != nil {
			panic("blobfs: unmapping a block buffer: " + err.Error())
		}
	}
}

// faultedHeapBuf allocates a buffer on the Go heap and faults its pages
// in, so that the cost lands where the caller chose (off the READ path).
func faultedHeapBuf(n int64) []byte {
	buf := make([]byte, n)
	touchPages(buf)
	return buf
}

func touchPages(buf []byte) {
	for i := 0; i < len(buf); i += 4096 {
		buf[i] = 0
	}
}

func bufBase(buf []byte) uintptr {
	return uintptr(unsafe.Pointer(unsafe.SliceData(buf)))
}

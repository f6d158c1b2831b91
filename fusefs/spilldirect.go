package fusefs

// Spill files written around the page cache.
//
// Why: the spill file of a file written sequentially is written once, read
// back once by its upload and emptied. Its pages in the page cache serve
// only that one read-back, yet each of them is a fresh page, and on a VM
// whose host takes back the memory the guest frees (virtio-balloon free
// page reporting, as on this project's machines) the first write to a
// fresh page faults in the host. Measured here with dd, 1 GiB into a new
// file: 3.8 s of system time; into the same file again: 0.17 s; with
// O_DIRECT: 0.18 s. Writing a 1 GiB file through blobfs to Azurite, the
// copies into the spill file's page cache were 69% of blobfs's CPU; written
// around it, blobfs used 1.75 s of CPU for that file instead of 4.96 s.
//
// How: a large WRITE whose offset, length and data are aligned to
// directAlign goes through a second descriptor of the spill file, opened
// with O_DIRECT; the session's request buffers put a WRITE's data on a page
// boundary (alignedRequestBuf). The uploads read the blocks back the same
// way into their page-aligned buffers (spillReader). Everything else, small
// or unaligned writes, reads through the mount, truncates and the
// read-modify-write load, stays buffered: the kernel keeps both kinds
// coherent (a direct write writes back and drops the cached pages it
// overlaps, a direct read writes back the dirty pages it covers first).
//
// Durability is as before: a WRITE is answered once its bytes are in the
// kernel's hands, the device's for a direct write, and they outlive the
// process. A cache directory whose file system refuses O_DIRECT is
// remembered (FS.noDirectSpill) and written through the page cache.

import (
	"errors"
	"os"
	"syscall"
	"unsafe"
)

// directAlign is the alignment O_DIRECT needs of offsets, lengths and
// buffers: the page size covers every logical block size in use.
const directAlign = 4096

// directWriteMin: smaller writes stay buffered. A direct write waits for
// the device, which a small file's single 4 KiB write would feel; from
// this size on the device's bandwidth, not its latency, is what counts.
const directWriteMin = 128 << 10

// writePayloadOffset is where a WRITE request's data starts: after the
// fuse_in_header (40 bytes) and the fuse_write_in (40 bytes).
const writePayloadOffset = 80

// alignedRequestBuf returns a request buffer of n bytes placed so that a
// WRITE's data starts on a directAlign boundary.
func alignedRequestBuf(n int) []byte {
	buf := make([]byte, n+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(&buf[writePayloadOffset]))%directAlign)) % directAlign
	return buf[skip : skip+n : skip+n]
}

// isAligned tells whether p and off suit O_DIRECT.
func isAligned(p []byte, off int64) bool {
	return len(p) > 0 && off%directAlign == 0 && len(p)%directAlign == 0 &&
		uintptr(unsafe.Pointer(&p[0]))%directAlign == 0
}

// writeSpillLocked writes data at off into the spill file, around the page
// cache when it is large and aligned.
func (of *openFile) writeSpillLocked(data []byte, off int64) error {
	if len(data) >= directWriteMin && isAligned(data, off) {
		if d := of.directLocked(); d != nil {
			_, err := d.WriteAt(data, off)
			if !errors.Is(err, syscall.EINVAL) {
				return err
			}
			// Refused after all (a file system that takes the flag
			// at open only): buffered from now on.
			of.fs.noDirectSpill.Store(true)
		}
	}
	_, err := of.spill.WriteAt(data, off)
	return err
}

// directLocked returns the spill file's O_DIRECT descriptor, opening it
// the first time; nil where the file system refuses one.
func (of *openFile) directLocked() *os.File {
	if of.direct != nil || of.spill == nil || of.fs.noDirectSpill.Load() {
		return of.direct
	}
	f, err := os.OpenFile(of.spillPath, os.O_RDWR|syscall.O_DIRECT, 0)
	if err != nil {
		if errors.Is(err, syscall.EINVAL) {
			of.fs.noDirectSpill.Store(true)
		}
		return nil
	}
	of.direct = f
	return f
}

// closeDirectLocked closes the O_DIRECT descriptor, if any; the spill file
// itself is the caller's to close or pool. A read still running on it (an
// abandoned block stream's) fails instead of reading another file: an
// os.File's descriptor is not reused until its last call returns.
func (of *openFile) closeDirectLocked() {
	if of.direct != nil {
		of.direct.Close()
		of.direct = nil
	}
}

// spillReaderLocked returns what uploads read the spill file through.
func (of *openFile) spillReaderLocked() spillReader {
	return spillReader{buffered: of.spill, direct: of.direct}
}

// spillReader reads a spill file, around the page cache where the buffer
// and offset allow: the data a direct write put on the device would
// otherwise come back through fresh page cache pages, the cost the direct
// write avoided.
type spillReader struct {
	buffered *os.File
	direct   *os.File // nil: no direct writes were made
}

func (r spillReader) ReadAt(p []byte, off int64) (int, error) {
	head := len(p) &^ (directAlign - 1)
	if r.direct == nil || head == 0 || !isAligned(p[:head], off) {
		return r.buffered.ReadAt(p, off)
	}
	n, err := r.direct.ReadAt(p[:head], off)
	if errors.Is(err, syscall.EINVAL) {
		return r.buffered.ReadAt(p, off)
	}
	if err != nil || n < head || head == len(p) {
		return n, err
	}
	// The unaligned end of the last block: a page at most, buffered.
	m, err := r.buffered.ReadAt(p[head:], off+int64(head))
	return n + m, err
}

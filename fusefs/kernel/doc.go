// Package kernel is blobfs's side of the FUSE kernel connection: mounting
// (mount(2), or fusermount3 without privilege), the /dev/fuse descriptor
// and the Session that reads requests from it and writes replies, adopting
// a live descriptor that another process kept, and unmounting or aborting
// a connection.
//
// It serves any fuse.RawFileSystem through go-fuse's ProtocolServer and
// knows nothing of blobs: what a file system can do beyond the raw
// operations it says through the optional interfaces DirectIOAware,
// PassthroughAware and Interrupter. It imports only package memory, for
// the address of a reply buffer.
package kernel

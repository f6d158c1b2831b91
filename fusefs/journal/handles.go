package journal

// IOMode is how a handle's open reply set the kernel's io mode.
type IOMode uint8

const (
	IOCached      IOMode = iota // page cache: counts against passthrough
	IODirect                    // FOPEN_DIRECT_IO without passthrough: neutral
	IOPassthrough               // FOPEN_PASSTHROUGH on the node's backing id
)

// OpenReply is what the reply to an OPEN said, for a resent OPEN to get
// the same answer (fusefs: handle.opened).
type OpenReply struct {
	Unique uint64 // the request's unique, without the resend bit
	Flags  uint32 // OpenOut.OpenFlags
}

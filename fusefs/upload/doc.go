// Package upload is the write side of a mount: a file's blocks staged
// while it is written (Stream), so that its commit sends only the tail;
// the blob's Content-MD5 hashed on the way (Hash); the blocks of one
// commit kept for the next (CarryOn); and the progress of long uploads in
// the log (Progress).
//
// It takes its buffers from package memory (memory.Uploads) and knows
// nothing of files or handles: fusefs's open files own their streams and
// serialise the calls (see Stream).
package upload

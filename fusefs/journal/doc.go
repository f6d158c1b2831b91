// Package journal is the state region's format: what a serving process
// journals, before each reply that depends on it, for the process that
// adopts its mount after it dies.
//
// The region (Region, a memfd that the keeper holds beside the /dev/fuse
// fd) is a header and a log of records: node ids and their lookup counts,
// open handles and their open replies, files' spill files and upload
// state, the namespace changes under way (Intent, the exactly-once
// journal), spill files being removed. ReadRegion replays a region into
// Saved, the tables a successor restores.
//
// Old and new blobfs meet here in a rolling upgrade: a driver adopts the
// region its predecessor wrote. Records are only ever added, never
// changed; testdata holds a region written by an earlier release, which
// this one must read (TestReadsEarlierRegion).
//
// It imports no other package of the project: the file system converts
// its nodes and handles to SavedNode and SavedHandle.
package journal

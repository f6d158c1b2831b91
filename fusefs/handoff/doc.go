// Package handoff carries FUSE mounts from one serving process to the next:
// the keeper, a small process that holds each mount's /dev/fuse fd and
// state region while servers come and go, and the client a server (the CSI
// driver, a mount's supervisor) uses to hold, adopt and drop mounts.
//
// It owns the keeper's wire protocol (SOCK_SEQPACKET, JSON messages,
// SCM_RIGHTS, SO_PEERCRED) and nothing of the file system: the fds and
// records it carries are opaque to it, so it imports no other package of
// the project, and both fusefs's users (csi, cmd/blobfs) reach it without
// reaching into the file system. See keeper.go for the protocol.
package handoff

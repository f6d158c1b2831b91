package blobstore

import (
	"fmt"
	"net"
	"net/netip"
	"syscall"
)

// Where blob requests never go. A volume's endpoint comes from a
// PersistentVolume or a StorageClass, and every request to it carries the
// volume's credential (a Shared Key signature, a SAS, an Azure AD token):
// an endpoint naming the instance metadata service would have the driver
// send them to a service that answers with the node's own identity, and
// one naming Azure's platform endpoint (WireServer) to a service that
// trusts the node. No blob service lives at such addresses, so the store
// refuses them: when an endpoint is checked (CheckEndpoint, a literal
// address), and on every connection, after name resolution, so that a
// host name that resolves there (or is made to, later) is refused too.
// Loopback and private addresses stay allowed: Azurite, private endpoints.

// refusedEndpointError says that a connection to addr was refused, and why.
type refusedEndpointError struct {
	addr netip.Addr
	why  string
}

func (e *refusedEndpointError) Error() string {
	return fmt.Sprintf("blobfs does not send blob requests to %s: %s", e.addr, e.why)
}

// wireServer is Azure's platform endpoint (168.63.129.16).
var wireServer = netip.AddrFrom4([4]byte{168, 63, 129, 16})

// refusedAddr says why blob requests must not go to a, or "" if they may.
func refusedAddr(a netip.Addr) string {
	a = a.Unmap()
	switch {
	case a == netip.AddrFrom4([4]byte{169, 254, 169, 254}):
		return "the instance metadata service's address"
	case a == wireServer:
		return "Azure's platform endpoint (WireServer)"
	case a.IsLinkLocalUnicast():
		return "a link-local address, where metadata services live"
	case a.IsUnspecified(), a.IsMulticast(), a.IsLinkLocalMulticast(), a.IsInterfaceLocalMulticast():
		return "not an address a service answers at"
	}
	return ""
}

// checkHostAddr refuses an endpoint host that is a literal address blob
// requests must not go to; a name is checked when it is resolved
// (guardDial).
func checkHostAddr(host string) error {
	a, err := netip.ParseAddr(host)
	if err != nil {
		return nil // a name
	}
	if why := refusedAddr(a); why != "" {
		return &refusedEndpointError{a.Unmap(), why}
	}
	return nil
}

// guardDial is a net.Dialer's Control: it runs after name resolution,
// before each connection, and refuses addresses blob requests must not
// go to.
func guardDial(network, address string, _ syscall.RawConn) error {
	host, _, err := net.SplitHostPort(address)
	if err != nil {
		return err
	}
	return checkHostAddr(host)
}

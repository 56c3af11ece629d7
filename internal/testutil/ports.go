// Package testutil holds helpers shared by the Go test suites.
package testutil

import (
	"net"
	"testing"
)

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment
// ago. All n listeners are held open together before any is closed, so the
// kernel cannot hand the same port out twice in one call (taking them one at
// a time once gave a test the same port for chimerad's admin API and its NFS
// listener). Another process can still take a port before the caller binds
// it; callers that start a server should retry on an early exit. Only for
// servers that cannot report a port they bound themselves (etcd and the
// apiserver, the operator's controller-runtime webhook and probe servers):
// chimerad binds port 0 and ChimeradPorts reads its ports back.
func FreePorts(t testing.TB, n int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	for len(ports) < n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("free port: %v", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// Command chimera-csi is the csi.chimera.io CSI driver: one binary serving the
// identity service plus the controller service, the node service, or both.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/klog/v2"

	"github.com/chimera-k8s/chimera/csi/pkg/driver"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	klog.InitFlags(nil)
	cfg := driver.Config{Version: version}
	var mode string
	flag.StringVar(&cfg.Endpoint, "endpoint", "unix:///csi/csi.sock", "CSI endpoint: unix:///path or tcp://host:port")
	flag.StringVar(&cfg.NodeID, "nodeid", "", "this node's id (required in node and all modes)")
	flag.StringVar(&mode, "mode", "all", "services to serve: controller, node or all")
	flag.StringVar(&cfg.Name, "drivername", driver.DriverName, "CSI driver name")
	flag.StringVar(&cfg.AdminEndpoint, "admin-endpoint", "", "default chimerad admin API (https://host:port; http only for a server configured without TLS) for ListVolumes, GetCapacity and classes naming no cluster")
	flag.StringVar(&cfg.AdminTokenFile, "admin-token-file", "", "file holding the admin token used when a request carries no CSI secret")
	flag.StringVar(&cfg.AdminCAFile, "admin-ca-file", "", "PEM CA bundle https admin endpoints are verified against (the operator's admin CA ConfigMap, mounted); empty: the system's roots")
	flag.StringVar(&cfg.AdminTLSServerName, "admin-tls-server-name", "", "name every admin server's certificate must carry instead of the endpoint's host (endpoints reached through a proxy; tests only)")
	flag.StringVar(&cfg.KubeletDir, "kubelet-dir", driver.KubeletDirDefault, "the kubelet's root directory (mountMode sidecar finds the pod's chimera-fuse emptyDir under <dir>/pods)")
	showVersion := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version)
		return
	}
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "chimera-csi: unexpected arguments %q\n", flag.Args())
		os.Exit(2)
	}
	cfg.Mode = driver.Mode(mode)
	d, err := driver.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chimera-csi: %v\n", err)
		os.Exit(2)
	}
	l, err := driver.Listen(cfg.Endpoint)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chimera-csi: %v\n", err)
		os.Exit(1)
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		s := <-sig
		klog.Infof("received %v, stopping", s)
		d.Stop()
	}()
	if err := d.Serve(l); err != nil {
		klog.Errorf("serve: %v", err)
		os.Exit(1)
	}
}

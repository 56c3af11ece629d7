// Command chimera-e2e-sidecar stands in for the Kubernetes CSI sidecars the
// chart ships (csi-provisioner, csi-node-driver-registrar, livenessprobe,
// csi-resizer), whose images and modules cannot be fetched on the machines the
// end-to-end test runs on (see TESTING.md). It takes the same flags the chart
// passes, so the chart is tested unchanged except for the sidecar image names
// (e2e values), and does the part of each sidecar's job the test exercises:
//
//   - registrar:   serves the kubelet plugin-registration API
//     (pluginregistration.Registration on /registration/<driver>-reg.sock),
//     so the kubelet registers the node plugin and CSINode lists the driver;
//     --mode=kubelet-registration-probe answers the chart's liveness probe.
//   - provisioner: watches PVCs of the driver's StorageClasses, calls
//     CreateVolume on the controller (the StorageClass parameters, the
//     provisioner secret, --extra-create-metadata keys) and creates the PV
//     with the fields external-provisioner sets; deletes Released PVs with
//     reclaim policy Delete through DeleteVolume. Failures become events.
//   - livenessprobe: /healthz on --health-port answers the driver's Probe.
//   - resizer:     idles (expansion is not part of this e2e).
//
// `chimera-e2e-sidecar httpget URL [TOKEN [CA_PEM SERVER_NAME]]` is the test's curl inside the
// node (run with kubectl exec in the node plugin's pod, on the node's
// network, where pod IPs are reachable and the host's are not): it prints
// "HTTP <code>" and the body.
//
// The mode comes from argv[0] (the image links /csi-node-driver-registrar
// here, the name the chart's liveness probe executes) or the first argument
// (the images' entrypoints). It is test infrastructure, never shipped.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const (
	// csiCallTimeout bounds every CSI call (the chart passes --timeout=60s).
	csiCallTimeoutDefault = 60 * time.Second
	// csiConnectTimeout bounds waiting for the driver's socket at start-up.
	csiConnectTimeout      = 5 * time.Minute
	registrationStatusFile = "/tmp/chimera-e2e-registered"
	// httpGetBodyMax bounds what httpget prints (metrics pages are ~100 KiB).
	httpGetBodyMax = 8 << 20
)

func main() {
	log.SetFlags(log.LstdFlags | log.Lmicroseconds)
	mode := filepath.Base(os.Args[0])
	args := os.Args[1:]
	if mode == "chimera-e2e-sidecar" && len(args) > 0 && args[0] == "httpget" {
		os.Exit(httpGet(args[1:]))
	}
	if mode == "chimera-e2e-sidecar" {
		if len(args) == 0 {
			log.Fatal("usage: chimera-e2e-sidecar registrar|provisioner|livenessprobe|resizer [flags]")
		}
		mode, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet(mode, flag.ExitOnError)
	csiAddress := fs.String("csi-address", "/csi/csi.sock", "the driver's CSI socket")
	regPath := fs.String("kubelet-registration-path", "", "the driver socket's path on the node (registrar)")
	regMode := fs.String("mode", "registration", "registrar: registration | kubelet-registration-probe")
	healthPort := fs.Int("health-port", 9808, "livenessprobe: port of /healthz")
	timeout := fs.Duration("timeout", csiCallTimeoutDefault, "timeout of each CSI call")
	extraMeta := fs.Bool("extra-create-metadata", false, "provisioner: pass PVC/PV names as parameters")
	defaultFSType := fs.String("default-fstype", "", "provisioner: fsType when the class sets none")
	// Flags of the real sidecars this stand-in accepts and ignores.
	fs.Int("v", 0, "log verbosity (ignored)")
	fs.Bool("leader-election", false, "ignored: the e2e runs one controller replica")
	fs.String("leader-election-namespace", "", "ignored")
	if err := fs.Parse(args); err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	var err error
	switch mode {
	case "csi-node-driver-registrar", "registrar":
		if *regMode == "kubelet-registration-probe" {
			err = registrationProbe()
		} else {
			err = runRegistrar(ctx, *csiAddress, *regPath, *timeout)
		}
	case "provisioner":
		err = runProvisioner(ctx, *csiAddress, *timeout, *extraMeta, *defaultFSType)
	case "livenessprobe":
		err = runLivenessProbe(ctx, *csiAddress, *healthPort, *timeout)
	case "resizer":
		log.Print("resizer stand-in: volume expansion is not exercised by this e2e; idling")
		<-ctx.Done()
	default:
		err = fmt.Errorf("unknown mode %q (registrar, provisioner, livenessprobe, resizer)", mode)
	}
	if err != nil && !errors.Is(err, context.Canceled) {
		log.Fatalf("%s: %v", mode, err)
	}
}

// dialCSI connects to the driver's unix socket (lazily: gRPC connects on the
// first call, which waitForDriver retries).
func dialCSI(address string) (*grpc.ClientConn, error) {
	address = strings.TrimPrefix(address, "unix://")
	return grpc.NewClient("unix://"+address, grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// waitForDriver returns the driver's name once GetPluginInfo answers.
func waitForDriver(ctx context.Context, conn *grpc.ClientConn, timeout time.Duration) (string, error) {
	id := csi.NewIdentityClient(conn)
	deadline := time.Now().Add(csiConnectTimeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, timeout)
		info, err := id.GetPluginInfo(cctx, &csi.GetPluginInfoRequest{})
		cancel()
		if err == nil {
			if info.GetName() == "" {
				return "", errors.New("GetPluginInfo returned an empty driver name")
			}
			return info.GetName(), nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("driver did not answer GetPluginInfo within %v: %w", csiConnectTimeout, err)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

func runLivenessProbe(ctx context.Context, address string, port int, timeout time.Duration) error {
	conn, err := dialCSI(address)
	if err != nil {
		return err
	}
	defer conn.Close()
	id := csi.NewIdentityClient(conn)
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), timeout)
		defer cancel()
		resp, err := id.Probe(pctx, &csi.ProbeRequest{})
		if err != nil {
			http.Error(w, "probe failed: "+err.Error(), http.StatusInternalServerError)
			return
		}
		if r := resp.GetReady(); r != nil && !r.GetValue() {
			http.Error(w, "driver not ready", http.StatusInternalServerError)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})
	srv := &http.Server{Addr: fmt.Sprintf(":%d", port), Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { <-ctx.Done(); _ = srv.Close() }()
	log.Printf("livenessprobe stand-in: /healthz on :%d probes %s", port, address)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// httpGet prints the status line and body of one GET (bearer TOKEN if given).
func httpGet(args []string) int {
	if len(args) < 1 || len(args) > 4 || len(args) == 3 {
		fmt.Fprintln(os.Stderr, "usage: chimera-e2e-sidecar httpget URL [TOKEN [CA_PEM SERVER_NAME]]")
		return 2
	}
	req, err := http.NewRequest(http.MethodGet, args[0], nil)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if len(args) >= 2 && args[1] != "" {
		req.Header.Set("Authorization", "Bearer "+args[1])
	}
	client := &http.Client{Timeout: 10 * time.Second}
	if len(args) == 4 {
		// An https admin API: verified against the given CA, for the name.
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM([]byte(args[2])) {
			fmt.Fprintln(os.Stderr, "CA_PEM holds no certificate")
			return 2
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: args[3], MinVersion: tls.VersionTLS12}}
	}
	resp, err := client.Do(req)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer resp.Body.Close()
	fmt.Printf("HTTP %d\n", resp.StatusCode)
	_, _ = io.Copy(os.Stdout, io.LimitReader(resp.Body, httpGetBodyMax))
	return 0
}

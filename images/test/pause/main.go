// pause is the sandbox ("infra") container of the test node's pods: it holds the
// pod's namespaces open and does nothing else. It sleeps until SIGTERM or SIGINT
// (then exits 0, so the runtime's stop is clean and fast) and, being PID 1 of a
// pod that may share its PID namespace, reaps every orphan that is re-parented to
// it so none lingers as a zombie.
//
// It is its own Go module (this folder's go.mod) so the root module's builds and
// tests never see it; it is built into localhost/pause:3.10 by images/test/Dockerfile.
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

// version is the pause image tag the test node names as its sandbox image.
const version = "3.10"

func main() {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "--version", "-v":
			fmt.Printf("pause %s (chimera test image)\n", version)
			return
		default:
			fmt.Fprintf(os.Stderr, "pause: unknown argument %q (only --version is accepted)\n", os.Args[1])
			os.Exit(2)
		}
	}
	// Buffered: a burst of SIGCHLDs collapses into one wake-up, and the reap loop
	// below drains every exited child, not just one per signal.
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		switch sig {
		case syscall.SIGCHLD:
			reapExited()
		default:
			fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
			os.Exit(0)
		}
	}
}

// reapExited collects every child that has exited, without blocking.
func reapExited() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

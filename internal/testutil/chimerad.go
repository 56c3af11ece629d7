package testutil

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// ChimeradPorts waits until the chimerad whose log is at logPath has logged
// a listener for every service ("nfs", "mount", "portmap", "admin",
// "metrics": {"msg":"listening","service":...,"addr":"ip:port"}) and returns
// their ports. With port 0 in its config the kernel picks each port, so a
// harness never guesses one that another process may take meanwhile. It
// fails when exited is closed first (the process is gone) or after timeout.
func ChimeradPorts(logPath string, services []string, exited <-chan struct{}, timeout time.Duration) (map[string]int, error) {
	deadline := time.Now().Add(timeout)
	for {
		found, err := listening(logPath, services)
		if err == nil && len(found) == len(services) {
			return found, nil
		}
		select {
		case <-exited:
			// The process may have logged its last lines just before exiting.
			if found, err := listening(logPath, services); err == nil && len(found) == len(services) {
				return found, nil
			}
			return nil, fmt.Errorf("chimerad exited before logging the ports of %v", missing(services, found))
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("chimerad did not log the ports of %v within %v", missing(services, found), timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func listening(logPath string, services []string) (map[string]int, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	want := map[string]bool{}
	for _, s := range services {
		want[s] = true
	}
	found := map[string]int{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var ev struct {
			Msg     string `json:"msg"`
			Service string `json:"service"`
			Addr    string `json:"addr"`
		}
		if json.Unmarshal(sc.Bytes(), &ev) != nil || ev.Msg != "listening" || !want[ev.Service] {
			continue
		}
		if _, dup := found[ev.Service]; dup {
			continue
		}
		i := strings.LastIndex(ev.Addr, ":")
		p, err := strconv.Atoi(ev.Addr[i+1:])
		if i < 0 || err != nil || p <= 0 || p > 65535 {
			return nil, fmt.Errorf("chimerad logged %s listening on %q: no port", ev.Service, ev.Addr)
		}
		found[ev.Service] = p
	}
	return found, sc.Err()
}

func missing(services []string, found map[string]int) []string {
	var m []string
	for _, s := range services {
		if _, ok := found[s]; !ok {
			m = append(m, s)
		}
	}
	return m
}

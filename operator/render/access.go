package render

import (
	"fmt"
	"net/netip"
	"sort"
	"strings"

	chimerav1 "github.com/chimera-k8s/chimera/api/v1alpha1"
	corev1 "k8s.io/api/core/v1"
)

// Limits of chimerad's export rules (dataplane/chimerad/CONFIG.md,
// exports.<name>.access): rules per export and clients per rule.
const (
	AccessRulesPerExportMax = 256
	AccessClientsPerRuleMax = 256
)

// AccessRule is one of chimerad's export client rules, in its JSON shape
// (the config's exports.<name>.access and the admin API's PUT /api/v1/access).
type AccessRule struct {
	Clients      []string `json:"clients"`
	AccessType   string   `json:"access_type"`
	Squash       string   `json:"squash"`
	AnonymousUID *int64   `json:"anonymous_uid,omitempty"`
	AnonymousGID *int64   `json:"anonymous_gid,omitempty"`
}

// NodeClients are the sources a client on one of nodes connects from: its
// InternalIP and ExternalIP addresses (NodeAddresses; the host network, and
// routed pod networks) and its pod ranges (spec.podCIDRs, where the cluster
// allocates them): a kernel client on the host reaching a pod through a
// bridge, point-to-point or overlay CNI (kind's kindnet, bridge, flannel)
// leaves from the node's own address in that range, and sidecar-mode clients
// are pods. Invalid ranges are skipped, as NodeAddresses skips host names.
func NodeClients(nodes []corev1.Node) []string {
	out := NodeAddresses(nodes)
	for _, n := range nodes {
		for _, s := range n.Spec.PodCIDRs {
			if p, err := netip.ParsePrefix(s); err == nil {
				out = append(out, p.Masked().String())
			}
		}
	}
	return out
}

// ExportAccess is the export rule list of c's MDS: the user's spec.access
// first (the first rule naming a client decides, so they can narrow or widen
// anything below), then every node client (NodeClients; read-write, no root
// squash: the kernel client mounts from the host and its root must stay root
// for the pod's files), then spec.network.podNetworkCIDRs (pod networks the
// nodes do not name, e.g. a CNI with its own IP pools). The result is
// deterministic: node clients sorted and deduplicated, split into rules of
// at most AccessClientsPerRuleMax clients. An empty list (no node has an
// address yet and nothing else is allowed) admits nobody.
func ExportAccess(c *chimerav1.ChimeraCluster, nodeClients []string) ([]AccessRule, error) {
	rules := make([]AccessRule, 0, len(c.Spec.Access)+2)
	for i, r := range c.Spec.Access {
		clients := make([]string, 0, len(r.Clients))
		for j, cl := range r.Clients {
			norm, err := AccessClient(cl)
			if err != nil {
				return nil, fmt.Errorf("spec.access[%d].clients[%d]: %w", i, j, err)
			}
			clients = append(clients, norm)
		}
		rules = append(rules, AccessRule{
			Clients:      clients,
			AccessType:   orDefaultStr(string(r.Access), string(chimerav1.AccessRW)),
			Squash:       orDefaultStr(string(r.Squash), string(chimerav1.SquashRoot)),
			AnonymousUID: r.AnonUID,
			AnonymousGID: r.AnonGID,
		})
	}
	seen := map[string]bool{}
	hosts := make([]string, 0, len(nodeClients))
	for _, a := range nodeClients {
		s, err := AccessClient(a)
		if err != nil || s == "*" {
			return nil, fmt.Errorf("node client %q: not an address or a range", a)
		}
		if ip, err := netip.ParseAddr(s); err == nil {
			s = ip.Unmap().String()
		}
		if !seen[s] {
			seen[s] = true
			hosts = append(hosts, s)
		}
	}
	sort.Strings(hosts)
	for len(hosts) > 0 {
		n := min(len(hosts), AccessClientsPerRuleMax)
		rules = append(rules, AccessRule{Clients: hosts[:n:n], AccessType: string(chimerav1.AccessRW), Squash: string(chimerav1.SquashNoRoot)})
		hosts = hosts[n:]
	}
	if cidrs := c.Spec.Network.PodNetworkCIDRs; len(cidrs) > 0 {
		clients := make([]string, 0, len(cidrs))
		for i, s := range cidrs {
			p, err := netip.ParsePrefix(s)
			if err != nil || p.Masked() != p {
				return nil, fmt.Errorf("spec.network.podNetworkCIDRs[%d]: %q is not a CIDR without host bits", i, s)
			}
			clients = append(clients, p.String())
		}
		rules = append(rules, AccessRule{Clients: clients, AccessType: string(chimerav1.AccessRW), Squash: string(chimerav1.SquashNoRoot)})
	}
	if len(rules) > AccessRulesPerExportMax {
		return nil, fmt.Errorf("%d export rules (spec.access, the nodes' addresses in rules of %d, the pod network); chimerad accepts %d",
			len(rules), AccessClientsPerRuleMax, AccessRulesPerExportMax)
	}
	return rules, nil
}

// AccessClient checks one client of a rule as chimerad reads it: "*", an
// IPv4 or IPv6 address, or a CIDR without host bits. Host names are refused
// (chimerad does not resolve them). It returns the canonical form.
func AccessClient(s string) (string, error) {
	if s == "*" {
		return s, nil
	}
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return "", fmt.Errorf("%q is not a CIDR (a.b.c.d/n or v6/n)", s)
		}
		if p.Masked() != p {
			return "", fmt.Errorf("%q has host bits below the /%d prefix (did you mean %s?)", s, p.Bits(), p.Masked())
		}
		return p.String(), nil
	}
	ip, err := netip.ParseAddr(s)
	if err != nil {
		return "", fmt.Errorf("%q is not an IP address, a CIDR or \"*\" (host names are not resolved)", s)
	}
	if ip.Zone() != "" {
		return "", fmt.Errorf("%q: a zoned IPv6 address names no client", s)
	}
	return ip.String(), nil
}

func orDefaultStr(v, d string) string {
	if v == "" {
		return d
	}
	return v
}

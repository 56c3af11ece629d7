// Package fakeadmin is an in-process stand-in for chimerad's admin API, used by
// the driver's tests until (and where) the real chimerad is not available. It
// follows the DESIGN.md contract strictly: bearer token or 401 with nothing
// changed, create idempotent by name (another capacity or other access rules
// -> 409), delete
// idempotent, expand never below use (400), 404 for unknown ids, 400 naming the
// field for bad JSON.
package fakeadmin

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
)

const (
	requestBytesMax  = 64 << 10
	volumesMax       = 4096
	capacityBytesMax = int64(1) << 50
)

// Volume is the fake's record of one volume.
type Volume struct {
	ID            string `json:"id"`
	Name          string `json:"name"`
	ExportPath    string `json:"exportPath"`
	CapacityBytes int64  `json:"capacityBytes"`
	UsedBytes     int64  `json:"usedBytes"`
	// Access is the volume's own client rules (null: none).
	Access []AccessRule `json:"access"`
}

// AccessRule is one client rule as chimerad stores and shows it (every
// field present).
type AccessRule struct {
	Clients      []string `json:"clients"`
	AccessType   string   `json:"access_type"`
	Squash       string   `json:"squash"`
	AnonymousUID uint32   `json:"anonymous_uid"`
	AnonymousGID uint32   `json:"anonymous_gid"`
}

// checkAccess is the part of chimerad's rule validation the driver can get
// wrong: the values, named by their key like chimerad does.
func checkAccess(rules []AccessRule) string {
	for i, r := range rules {
		if len(r.Clients) == 0 {
			return fmt.Sprintf("access[%d].clients: required", i)
		}
		switch r.AccessType {
		case "rw", "ro", "none":
		default:
			return fmt.Sprintf("access[%d].access_type: %q is not rw, ro or none", i, r.AccessType)
		}
		switch r.Squash {
		case "root_squash", "all_squash", "no_root_squash":
		default:
			return fmt.Sprintf("access[%d].squash: %q is not root_squash, all_squash or no_root_squash", i, r.Squash)
		}
	}
	return ""
}

// Server is a running fake admin API on 127.0.0.1.
type Server struct {
	Token string
	URL   string

	mu       sync.Mutex
	byID     map[string]*Volume
	nextID   int
	listener net.Listener
	srv      *http.Server
	// Unauthorized counts requests refused for a missing or wrong token.
	Unauthorized atomic.Int64
}

// Start listens on an ephemeral loopback port.
func Start(token string) (*Server, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &Server{Token: token, URL: "http://" + l.Addr().String(), byID: map[string]*Volume{}, listener: l}
	mux := http.NewServeMux()
	mux.HandleFunc("/api/v1/volumes", s.auth(s.volumes))
	mux.HandleFunc("/api/v1/volumes/", s.auth(s.volume))
	mux.HandleFunc("/api/v1/cluster", s.auth(s.cluster))
	s.srv = &http.Server{Handler: mux}
	go s.srv.Serve(l)
	return s, nil
}

// Close stops the server.
func (s *Server) Close() { s.srv.Close() }

// SetUsed records usage for a volume (what writes through NFS would do).
func (s *Server) SetUsed(id string, usedBytes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v := s.byID[id]; v != nil {
		v.UsedBytes = usedBytes
	}
}

// Count returns the number of volumes.
func (s *Server) Count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

func (s *Server) auth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+s.Token {
			s.Unauthorized.Add(1)
			fail(w, http.StatusUnauthorized, "missing or invalid bearer token")
			return
		}
		h(w, r)
	}
}

func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(map[string]string{"error": msg})
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func decode(w http.ResponseWriter, r *http.Request, into any) bool {
	dec := json.NewDecoder(io.LimitReader(r.Body, requestBytesMax))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		fail(w, http.StatusBadRequest, "invalid JSON body: "+err.Error())
		return false
	}
	return true
}

func (s *Server) volumes(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		s.mu.Lock()
		out := make([]Volume, 0, len(s.byID))
		for _, v := range s.byID {
			out = append(out, *v)
		}
		s.mu.Unlock()
		sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
		reply(w, http.StatusOK, map[string]any{"volumes": out})
	case http.MethodPost:
		var req struct {
			Name           string       `json:"name"`
			CapacityBytes  *int64       `json:"capacityBytes"`
			SourceSnapshot string       `json:"sourceSnapshot"`
			Access         []AccessRule `json:"access"`
		}
		if !decode(w, r, &req) {
			return
		}
		if msg := checkAccess(req.Access); msg != "" {
			fail(w, http.StatusBadRequest, msg)
			return
		}
		if req.Name == "" || strings.ContainsAny(req.Name, "/\x00") {
			fail(w, http.StatusBadRequest, "name: must be non-empty without '/'")
			return
		}
		if req.CapacityBytes == nil || *req.CapacityBytes <= 0 || *req.CapacityBytes > capacityBytesMax {
			fail(w, http.StatusBadRequest, fmt.Sprintf("capacityBytes: must be in 1..%d", capacityBytesMax))
			return
		}
		if req.SourceSnapshot != "" {
			fail(w, http.StatusBadRequest, "sourceSnapshot: snapshots are not supported")
			return
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, v := range s.byID {
			if v.Name == req.Name {
				if v.CapacityBytes != *req.CapacityBytes {
					fail(w, http.StatusConflict, fmt.Sprintf("volume %q exists with capacityBytes %d", v.Name, v.CapacityBytes))
					return
				}
				if !reflect.DeepEqual(v.Access, req.Access) {
					fail(w, http.StatusConflict, fmt.Sprintf("volume %q exists with other access rules", v.Name))
					return
				}
				reply(w, http.StatusOK, v)
				return
			}
		}
		if len(s.byID) >= volumesMax {
			fail(w, http.StatusInsufficientStorage, "too many volumes")
			return
		}
		s.nextID++
		id := fmt.Sprintf("v%06d", s.nextID)
		v := &Volume{ID: id, Name: req.Name, ExportPath: "/volumes/" + id, CapacityBytes: *req.CapacityBytes, Access: req.Access}
		s.byID[id] = v
		reply(w, http.StatusCreated, v)
	default:
		fail(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

func (s *Server) volume(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/api/v1/volumes/")
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.byID[id]
	switch r.Method {
	case http.MethodGet:
		if v == nil {
			fail(w, http.StatusNotFound, "volume "+id+" not found")
			return
		}
		reply(w, http.StatusOK, v)
	case http.MethodDelete:
		delete(s.byID, id)
		w.WriteHeader(http.StatusNoContent)
	case http.MethodPatch:
		var req struct {
			CapacityBytes *int64 `json:"capacityBytes"`
		}
		if !decode(w, r, &req) {
			return
		}
		if v == nil {
			fail(w, http.StatusNotFound, "volume "+id+" not found")
			return
		}
		if req.CapacityBytes == nil || *req.CapacityBytes <= 0 || *req.CapacityBytes > capacityBytesMax {
			fail(w, http.StatusBadRequest, fmt.Sprintf("capacityBytes: must be in 1..%d", capacityBytesMax))
			return
		}
		if *req.CapacityBytes < v.UsedBytes {
			fail(w, http.StatusBadRequest, fmt.Sprintf("capacityBytes: %d is below usedBytes %d", *req.CapacityBytes, v.UsedBytes))
			return
		}
		v.CapacityBytes = *req.CapacityBytes
		reply(w, http.StatusOK, v)
	default:
		fail(w, http.StatusMethodNotAllowed, "method not allowed")
	}
}

func (s *Server) cluster(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		fail(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	s.mu.Lock()
	var allocated int64
	for _, v := range s.byID {
		allocated += v.CapacityBytes
	}
	s.mu.Unlock()
	reply(w, http.StatusOK, map[string]any{"name": "fake", "capacityBytes": capacityBytesMax, "availableBytes": capacityBytesMax - allocated})
}

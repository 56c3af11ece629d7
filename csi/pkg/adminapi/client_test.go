package adminapi

// Proves the client's handling of what a server may answer: both list shapes,
// the error message taken from {"error": ...} and truncated, non-JSON and
// oversized answers refused, answers without ids refused, the bearer token sent,
// and bad endpoints named before any request is made.

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"
)

func serve(t *testing.T, h http.HandlerFunc) *Client {
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New(srv.URL, "tok", nil)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestListShapesAndToken(t *testing.T) {
	for _, body := range []string{`[{"id":"a","exportPath":"/v/a","capacityBytes":1}]`, `{"volumes":[{"id":"a","exportPath":"/v/a","capacityBytes":1}]}`} {
		c := serve(t, func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer tok" {
				w.WriteHeader(401)
				return
			}
			w.Write([]byte(body))
		})
		vols, err := c.ListVolumes(context.Background())
		if err != nil || len(vols) != 1 || vols[0].ID != "a" || vols[0].ExportPath != "/v/a" {
			t.Fatalf("%s: %v %v", body, vols, err)
		}
	}
}

func TestErrorsAndHostileAnswers(t *testing.T) {
	long := strings.Repeat("x", 2000)
	cases := []struct {
		status  int
		body    string
		mention string
	}{
		{409, `{"error":"volume \"a\" exists with capacityBytes 5"}`, `exists with capacityBytes 5`},
		{400, `{"message":"capacityBytes: must be positive"}`, "capacityBytes: must be positive"},
		{500, "plain text failure", "plain text failure"},
		{503, "", "503"},
		{400, `{"error":"` + long + `"}`, "..."},
	}
	for _, c := range cases {
		cl := serve(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(c.status)
			w.Write([]byte(c.body))
		})
		_, err := cl.GetVolume(context.Background(), "a")
		if StatusOf(err) != c.status || !strings.Contains(err.Error(), c.mention) {
			t.Errorf("status %d: got %v (status %d)", c.status, err, StatusOf(err))
		}
		if len(err.Error()) > errorMessageBytesMax+100 {
			t.Errorf("error message not truncated: %d bytes", len(err.Error()))
		}
	}
	for _, body := range []string{`not json`, `{"exportPath":"/x"}`, `{"id":"a","capacityBytes":-1}`} {
		cl := serve(t, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte(body)) })
		if _, err := cl.GetVolume(context.Background(), "a"); err == nil || StatusOf(err) != 0 {
			t.Errorf("answer %q accepted: %v", body, err)
		}
	}
	big := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte(`{"volumes":[`))
		chunk := []byte(strings.Repeat(" ", 1<<20))
		for i := 0; i < 10; i++ {
			w.Write(chunk)
		}
	})
	if _, err := big.ListVolumes(context.Background()); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("oversized answer: %v", err)
	}
}

func TestParseEndpoint(t *testing.T) {
	for _, ok := range []string{"http://127.0.0.1:8080", "https://mds.ns.svc:8080/", "http://[::1]:8080"} {
		if _, err := ParseEndpoint(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "127.0.0.1:8080", "ftp://x", "http://", "http://x/api", "http://u:p@x", "http://x?q=1"} {
		if _, err := ParseEndpoint(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// CreateVolume's body: the rules when the class has some, exactly in the
// admin API's syntax; no "access" key at all when it has none.
func TestCreateVolumeBody(t *testing.T) {
	var bodies []string
	c := serve(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies = append(bodies, string(b))
		w.WriteHeader(201)
		w.Write([]byte(`{"id":"a","exportPath":"/v/a","capacityBytes":1,"access":[{"clients":["*"],"access_type":"ro","squash":"root_squash","anonymous_uid":7,"anonymous_gid":8}]}`))
	})
	rules := []AccessRule{{Clients: []string{"*"}, AccessType: "ro", Squash: "root_squash", AnonymousUID: 7, AnonymousGID: 8}}
	v, err := c.CreateVolume(context.Background(), "a", 1, rules)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(v.Access, rules) {
		t.Fatalf("access read back %+v", v.Access)
	}
	if _, err := c.CreateVolume(context.Background(), "a", 1, nil); err != nil {
		t.Fatal(err)
	}
	want := []string{
		`{"access":[{"clients":["*"],"access_type":"ro","squash":"root_squash","anonymous_uid":7,"anonymous_gid":8}],"capacityBytes":1,"name":"a"}`,
		`{"capacityBytes":1,"name":"a"}`,
	}
	if len(bodies) != 2 || strings.TrimSpace(bodies[0]) != want[0] || strings.TrimSpace(bodies[1]) != want[1] {
		t.Fatalf("bodies %q, want %q", bodies, want)
	}
}

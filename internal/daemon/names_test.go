package daemon_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/daemon"
)

// refuses checks that a request is answered with an error of code whose
// message holds each of says.
func (k *kilnd) refuses(method, path string, body any, status int, code string, says ...string) {
	k.t.Helper()
	got, b := k.do(method, path, k.d.Token(), body)
	var e api.Error
	if err := json.Unmarshal(b, &e); got != status || err != nil || e.Error.Code != code {
		k.t.Errorf("%s %s: %d %s, want %d %s", method, path, got, clip(b), status, code)
		return
	}
	for _, s := range says {
		if !strings.Contains(e.Error.Message, s) {
			k.t.Errorf("%s %s: message %q does not say %q", method, path, e.Error.Message, s)
		}
	}
}

// ids are the ids of the sandboxes kilnd lists.
func (k *kilnd) ids() []string {
	k.t.Helper()
	var list []daemon.Info
	k.json("GET", "/sandboxes", nil, &list)
	var ids []string
	for _, s := range list {
		ids = append(ids, s.ID)
	}
	return ids
}

// TestSandboxNames: a sandbox created with a name is found by it on every
// kind of route (its own, the agent's, its logs'), is its hostname
// inside, and answers carry its full id; the name is held until the
// sandbox is deleted, and then free to take again.
func TestSandboxNames(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	var web daemon.Info
	k.json("POST", "/sandboxes", `{"name":"web"}`, &web)
	if web.Name != "web" || web.Hostname != "web" || !api.IsSandboxID(web.ID) {
		t.Fatalf("created %+v, want the name web as its name and hostname", web)
	}
	var got daemon.Info
	k.json("GET", "/sandboxes/web", nil, &got)
	if got.ID != web.ID || got.Name != "web" {
		t.Errorf("GET by name: %+v, want %s named web", got, web.ID)
	}
	var list []daemon.Info
	k.json("GET", "/sandboxes", nil, &list)
	if len(list) != 1 || list[0].Name != "web" {
		t.Errorf("listed %+v, want the one sandbox, named web", list)
	}
	var res api.ExecResult
	k.json("POST", "/sandboxes/web/exec", api.ExecRequest{Command: "cat", Args: []string{"/proc/sys/kernel/hostname"}}, &res)
	if res.Stdout != "web\n" {
		t.Errorf("hostname inside: %q, want web", res.Stdout)
	}
	var logs []daemon.CapturedLog
	k.json("GET", "/sandboxes/web/logs", nil, &logs)

	// A name taken is refused, and nothing is made.
	k.refuses("POST", "/sandboxes", `{"name":"web"}`, 409, api.CodeConflict, `"web"`, web.ID)
	if ids := k.ids(); !slices.Equal(ids, []string{web.ID}) {
		t.Errorf("after a refused create: %v, want only %s", ids, web.ID)
	}

	// A hostname given is the hostname; the name stays the name.
	var api2 daemon.Info
	k.json("POST", "/sandboxes", `{"name":"api","hostname":"backend"}`, &api2)
	if api2.Name != "api" || api2.Hostname != "backend" {
		t.Errorf("created %+v, want name api and hostname backend", api2)
	}

	// Deleted by its name, the sandbox frees it: it finds nothing, and a
	// new sandbox can take it.
	k.json("DELETE", "/sandboxes/web", nil, nil)
	k.refuses("GET", "/sandboxes/web", nil, 404, api.CodeNotFound, `"web"`)
	var again daemon.Info
	k.json("POST", "/sandboxes", `{"name":"web"}`, &again)
	if again.ID == web.ID || again.Name != "web" {
		t.Fatalf("created again %+v", again)
	}
	k.json("GET", "/sandboxes/web", nil, &got)
	if got.ID != again.ID {
		t.Errorf("GET web after it was taken again: %s, want the new sandbox %s", got.ID, again.ID)
	}
	// The deleted one's logs are still reached by its id.
	k.json("GET", "/sandboxes/"+web.ID+"/logs", nil, &logs)
}

// TestSandboxBadNames: a name that is not a lower-case DNS label is
// refused, naming it, and nothing is made.
func TestSandboxBadNames(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	for _, name := range []string{"Web", "-web", "web-", "we_b", "we.b", "we b", "wéb", strings.Repeat("a", 64)} {
		body, _ := json.Marshal(api.CreateSandbox{Name: name})
		k.refuses("POST", "/sandboxes", string(body), 400, api.CodeInvalid, "sandbox name "+strconv.Quote(name))
	}
	if ids := k.ids(); len(ids) != 0 {
		t.Errorf("after refused creates: %v, want none", ids)
	}
	// The bounds themselves are names.
	var info daemon.Info
	long := strings.Repeat("a", 62) + "9"
	k.json("POST", "/sandboxes", api.CreateSandbox{Name: long}, &info)
	if info.Name != long || info.Hostname != long {
		t.Errorf("created %+v, want the 63-character name", info)
	}
	k.json("POST", "/sandboxes", api.CreateSandbox{Name: "0"}, &info)
	if info.Name != "0" {
		t.Errorf("created %+v, want the name 0", info)
	}
}

// TestSandboxIDPrefixes: its short id, and any 4 or more of its id's
// first characters that no other id begins with, find a sandbox on every
// route (answers carry the full id); fewer than 4 find nothing, nor does a
// prefix of a deleted one. (A prefix two ids share, which two random ids
// rarely do in 4 characters, is refused naming both:
// TestShortIDsWithAThousandSandboxes.)
func TestSandboxIDPrefixes(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	a, b := k.sandbox(), k.sandbox()
	unique := 4
	for a[:unique] == b[:unique] {
		unique++
	}
	for _, ref := range []string{api.ShortID(a), a[:unique]} {
		var got daemon.Info
		k.json("GET", "/sandboxes/"+ref, nil, &got)
		if got.ID != a {
			t.Errorf("GET by prefix %s: %s, want %s", ref, got.ID, a)
		}
	}
	// The agent's routes and the logs' take a prefix too.
	var res api.ExecResult
	k.json("POST", "/sandboxes/"+a[:unique]+"/exec", api.ExecRequest{Command: "true"}, &res)
	if res.ExitCode == nil || *res.ExitCode != 0 {
		t.Errorf("exec by prefix: %+v", res)
	}
	var logs []daemon.CapturedLog
	k.json("GET", "/sandboxes/"+a[:unique]+"/logs", nil, &logs)
	k.refuses("GET", "/sandboxes/"+a[:3], nil, 404, api.CodeNotFound)
	k.json("DELETE", "/sandboxes/"+b, nil, nil)
	k.refuses("GET", "/sandboxes/"+api.ShortID(b), nil, 404, api.CodeNotFound)
}

// TestSandboxNameSurvivesRestart: a new kilnd on the same state directory
// finds the sandbox by its name, and still refuses the name to another.
func TestSandboxNameSurvivesRestart(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	var info daemon.Info
	k.json("POST", "/sandboxes", `{"name":"keeper"}`, &info)
	k.stop()
	k2 := start(t, k.state)
	defer k2.cleanup()
	var got daemon.Info
	k2.json("GET", "/sandboxes/keeper", nil, &got)
	if got.ID != info.ID || got.Name != "keeper" || got.Hostname != "keeper" || got.State != daemon.StateRunning {
		t.Errorf("after restart: %+v, want %s running, named keeper", got, info.ID)
	}
	k2.refuses("POST", "/sandboxes", `{"name":"keeper"}`, 409, api.CodeConflict, `"keeper"`)
	if ids := k2.ids(); !slices.Equal(ids, []string{info.ID}) {
		t.Errorf("after a refused create: %v, want only %s", ids, info.ID)
	}
}

// TestSandboxNameRace: creates asking for the same name at once get it
// once; the others are refused and leave nothing behind.
func TestSandboxNameRace(t *testing.T) {
	t.Parallel()
	k := start(t, "")
	defer k.cleanup()
	const n = 4
	codes := make([]int, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", "http://"+k.addr+"/sandboxes", strings.NewReader(`{"name":"race"}`))
			req.Header.Set("Authorization", "Bearer "+k.d.Token())
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				errs[i] = err
				return
			}
			resp.Body.Close()
			codes[i] = resp.StatusCode
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	slices.Sort(codes)
	if want := []int{201, 409, 409, 409}; !slices.Equal(codes, want) {
		t.Errorf("answers %v, want %v", codes, want)
	}
	var list []daemon.Info
	k.json("GET", "/sandboxes", nil, &list)
	if len(list) != 1 || list[0].Name != "race" {
		t.Errorf("listed %+v, want one sandbox named race", list)
	}
}

package daemon_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/sandkiln/sandkiln/api"
)

// TestLabelsAndListFilters: labels are kept and shown; GET /sandboxes
// chooses by label, name, state, runtime and node, pages by limit and cursor
// (each sandbox once), takes the deleted ones in when asked, and refuses a
// parameter or a value it does not know; kilnd_sandbox_info joins names
// and labels to the sandbox's id.
func TestLabelsAndListFilters(t *testing.T) {
	k := start(t, "")
	defer k.cleanup()
	var a, b, c api.Sandbox
	k.json("POST", "/sandboxes", api.CreateSandbox{Name: "front", Labels: map[string]string{"team": "web", "tier": "front", "app.kubernetes.io/name": "shop"}}, &a)
	k.json("POST", "/sandboxes", api.CreateSandbox{Labels: map[string]string{"team": "web"}}, &b)
	k.json("POST", "/sandboxes", api.CreateSandbox{Name: "other"}, &c)
	if a.Labels["tier"] != "front" || len(a.Labels) != 3 {
		t.Errorf("create answered labels %v", a.Labels)
	}
	var got api.Sandbox
	k.json("GET", "/sandboxes/front", nil, &got)
	if got.Labels["app.kubernetes.io/name"] != "shop" {
		t.Errorf("GET answered labels %v", got.Labels)
	}

	ids := func(query string) []string {
		t.Helper()
		var list []api.Sandbox
		k.json("GET", "/sandboxes"+query, nil, &list)
		var out []string
		for _, s := range list {
			out = append(out, s.ID)
		}
		return out
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{a.ID, b.ID, c.ID}},
		{"?label=team=web", []string{a.ID, b.ID}},
		{"?label=team=web&label=tier", []string{a.ID}},
		{"?label=tier=back", nil},
		{"?label=team", []string{a.ID, b.ID}},
		{"?name=other", []string{c.ID}},
		{"?state=running&runtime=namespaces", []string{a.ID, b.ID, c.ID}},
		{"?state=stopped", nil},
		{"?runtime=gvisor", nil},
		// A kilnd in no cluster: its sandboxes are on no node.
		{"?node=elsewhere", nil},
	} {
		if got := ids(c.query); !slices.Equal(got, c.want) {
			t.Errorf("GET /sandboxes%s: %v, want %v", c.query, got, c.want)
		}
	}

	// Pages of 2: every sandbox once, the last page without a cursor.
	var paged []string
	next := "/sandboxes?limit=2"
	for pages := 0; next != ""; pages++ {
		if pages > 3 {
			t.Fatal("pages do not end")
		}
		req, _ := http.NewRequest("GET", "http://"+k.addr+next, nil)
		req.Header.Set("Authorization", "Bearer "+k.d.Token())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		cursor := resp.Header.Get(api.NextCursorHeader)
		link := resp.Header.Get("Link")
		page := ids(strings.TrimPrefix(next, "/sandboxes"))
		paged = append(paged, page...)
		next = ""
		if cursor != "" {
			if !strings.HasPrefix(link, "</sandboxes?") || !strings.HasSuffix(link, `>; rel="next"`) || !strings.Contains(link, "cursor="+cursor) {
				t.Errorf("Link %q with cursor %q", link, cursor)
			}
			next = strings.TrimSuffix(strings.TrimPrefix(link, "<"), `>; rel="next"`)
		}
	}
	if !slices.Equal(paged, []string{a.ID, b.ID, c.ID}) {
		t.Errorf("pages held %v", paged)
	}

	k.json("DELETE", "/sandboxes/"+b.ID, nil, nil)
	if got := ids("?label=team=web"); !slices.Equal(got, []string{a.ID}) {
		t.Errorf("after b's delete: %v", got)
	}
	if got := ids("?all=true&label=team=web"); !slices.Equal(got, []string{a.ID, b.ID}) {
		t.Errorf("all, after b's delete: %v", got)
	}
	if got := ids("?state=deleted"); !slices.Equal(got, []string{b.ID}) {
		t.Errorf("the deleted ones: %v", got)
	}

	for _, c := range []struct{ query, says string }{
		{"?limit=0", "limit"},
		{"?limit=1001", "want 1 to 1000"},
		{"?lable=team", `"lable"`},
		{"?state=frozen", "state"},
		{"?label=team%3D%3D&label=bad%20key", "bad key"},
		{"?name=a&name=b", "name given 2 times"},
	} {
		k.refuses("GET", "/sandboxes"+c.query, nil, 400, api.CodeInvalid, c.says)
	}
	long := strings.Repeat("k", api.MaxLabelKeyLen+1)
	for _, labels := range []map[string]string{
		{"": "x"}, {"-a": "x"}, {"a=b": "x"}, {long: "x"}, {"ok": strings.Repeat("v", api.MaxLabelValueLen+1)}, {"ok": "a\nb"},
	} {
		k.refuses("POST", "/sandboxes", api.CreateSandbox{Labels: labels}, 400, api.CodeInvalid, "labels")
	}
	many := map[string]string{}
	for i := range api.MaxLabels + 1 {
		many[strings.Repeat("k", i+1)] = ""
	}
	k.refuses("POST", "/sandboxes", api.CreateSandbox{Labels: many}, 400, api.CodeInvalid, "labels: 65 of them")

	body := k.scrape()
	want := map[string][]string{
		a.ID: {`name="front"`, `label_team="web"`, `label_tier="front"`, `label_app_kubernetes_io_name="shop"`, `runtime="namespaces"`, `state="running"`},
		c.ID: {`name="other"`, `label_team=""`},
	}
	for id, labels := range want {
		if v, ok := sample(body, "kilnd_sandbox_info", append([]string{`sandbox="` + id + `"`}, labels...)...); !ok || v != 1 {
			t.Errorf("kilnd_sandbox_info of %s with %v: %v (%v)\n%s", id, labels, v, ok, grepLines(body, "kilnd_sandbox_info"))
		}
	}
	if _, ok := sample(body, "kilnd_sandbox_info", `sandbox="`+b.ID+`"`); ok {
		t.Error("a deleted sandbox has an info series")
	}
	promtoolCheck(t, body)
}

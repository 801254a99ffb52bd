package apitest

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/sandkiln/sandkiln/api"
)

// thingsDocument is a small API: a thing with a required name and a list
// of tags, its NDJSON history, files under a path, and a WebSocket.
const thingsDocument = `
openapi: 3.0.3
info: {title: things, version: "1"}
paths:
  /things/{id}:
    parameters: [{name: id, in: path, required: true, schema: {type: string}}]
    get:
      operationId: getThing
      responses:
        "200":
          description: the thing
          content:
            application/json:
              schema: {$ref: "#/components/schemas/Thing"}
        "404": {$ref: "#/components/responses/Error"}
    delete:
      operationId: deleteThing
      responses:
        "204": {description: deleted}
  /things/{id}/history:
    parameters: [{name: id, in: path, required: true, schema: {type: string}}]
    get:
      operationId: history
      responses:
        "200":
          description: one thing a line
          content:
            application/x-ndjson:
              schema: {$ref: "#/components/schemas/Thing"}
  /things/{id}/watch:
    parameters: [{name: id, in: path, required: true, schema: {type: string}}]
    get:
      operationId: watch
      responses:
        "101": {description: WebSocket}
  /things/{id}/ping:
    parameters: [{name: id, in: path, required: true, schema: {type: string}}]
    get:
      operationId: ping
      responses:
        "200": {description: pong}
  /files/{path}:
    parameters: [{name: path, in: path, required: true, schema: {type: string}}]
    get:
      operationId: readFile
      responses:
        "200":
          description: the bytes
          content:
            application/octet-stream: {schema: {type: string, format: binary}}
components:
  responses:
    Error:
      description: an error
      content:
        application/json:
          schema:
            type: object
            required: [error]
            properties:
              error:
                type: object
                required: [code, message]
                properties:
                  code: {type: string}
                  message: {type: string}
  schemas:
    Thing:
      type: object
      required: [name, tags]
      properties:
        name: {type: string}
        tags: {type: array, items: {type: string}}
`

// answer is a handler answering with status, a Content-Type and body.
func answer(status int, contentType, body string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if contentType != "" {
			w.Header().Set("Content-Type", contentType)
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	}
}

// TestValidatorReports serves answers that match the document and answers
// that do not, through a Validator, and holds each to what it reports.
func TestValidatorReports(t *testing.T) {
	const errorBody = `{"error":{"code":"not_found","message":"no thing"}}`
	for _, tc := range []struct {
		name    string
		method  string
		path    string
		header  http.Header
		handler http.HandlerFunc
		// want are the fragments of the mismatch reported; none: it matched.
		want []string
	}{
		{"matching", "GET", "/things/1", nil, answer(200, "application/json", `{"name":"a","tags":[]}`), nil},
		{"documented error", "GET", "/things/1", nil, answer(404, "application/json", errorBody), nil},
		{"no content", "DELETE", "/things/1", nil, answer(204, "", ""), nil},
		{"a required field missing", "GET", "/things/1", nil, answer(200, "application/json", `{"tags":[]}`),
			[]string{"GET /things/{id} (getThing): answered 200", `property "name" is missing`}},
		{"null for an array", "GET", "/things/1", nil, answer(200, "application/json", `{"name":"a","tags":null}`),
			[]string{"getThing", "answered 200", "tags"}},
		{"wrong type", "GET", "/things/1", nil, answer(200, "application/json", `{"name":7,"tags":[]}`),
			[]string{"getThing", "name", "string"}},
		{"undocumented status", "GET", "/things/1", nil, answer(500, "application/json", errorBody),
			[]string{"getThing", "answered 500, a status the operation does not document"}},
		{"undocumented content type", "GET", "/things/1", nil, answer(200, "text/plain", "a"),
			[]string{"getThing", `Content-Type "text/plain"`}},
		{"an undescribed body", "GET", "/things/1/ping", nil, answer(200, "application/json", `{}`),
			[]string{"ping", "answered 200 with a body (application/json) the document does not describe"}},
		{"an error without the error body", "GET", "/things/1", nil, answer(404, "application/json", `{"message":"x"}`),
			[]string{"getThing", "answered 404", `property "error" is missing`}},
		{"ndjson lines", "GET", "/things/1/history", nil, answer(200, "application/x-ndjson", "{\"name\":\"a\",\"tags\":[]}\n{\"name\":\"b\",\"tags\":[\"x\"]}\n{\"na"), nil},
		{"an ndjson line wrong", "GET", "/things/1/history", nil, answer(200, "application/x-ndjson", "{\"name\":\"a\",\"tags\":[]}\n{\"name\":\"b\"}\n"),
			[]string{"history", "line 2", `property "tags" is missing`}},
		{"binary", "GET", "/files/a/b/c.txt", nil, answer(200, "application/octet-stream", "\x00\x01"), nil},
		{"no such operation", "POST", "/things/1", nil, answer(200, "application/json", `{}`),
			[]string{"POST /things/1: answered 200, and the document has no such operation"}},
		{"a CORS preflight", "OPTIONS", "/things/1", http.Header{"Origin": {"http://a.example"}, "Access-Control-Request-Method": {"PUT"}}, answer(204, "", ""), nil},
		{"no such path, an error", "GET", "/elsewhere", nil, answer(404, "application/json", errorBody), nil},
		{"no such path, a bad error", "GET", "/elsewhere", nil, answer(404, "application/json", `{"error":"no"}`),
			[]string{"GET /elsewhere: answered 404: error body"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, err := NewValidator([]byte(thingsDocument))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(v.Wrap(tc.handler))
			defer srv.Close()
			req, _ := http.NewRequest(tc.method, srv.URL+tc.path, nil)
			for k, vs := range tc.header {
				req.Header[k] = vs
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			srv.Close() // the check is done once the handler returns
			err = v.Err()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("a matching answer reported: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("nothing reported; want %q", tc.want)
			}
			t.Logf("reported: %v", err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("report %q does not say %q", err, w)
				}
			}
		})
	}
}

// TestValidatorWebSocket switches protocols through a Validator: a
// documented 101 passes, its messages unchecked, and one the operation
// does not document is reported.
func TestValidatorWebSocket(t *testing.T) {
	v, err := NewValidator([]byte(thingsDocument))
	if err != nil {
		t.Fatal(err)
	}
	checked := v.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := websocket.Accept(w, r, nil)
		if err != nil {
			return
		}
		defer c.CloseNow()
		c.Write(r.Context(), websocket.MessageText, []byte("not JSON, not checked"))
		c.Close(websocket.StatusNormalClosure, "")
	}))
	// A hijacked connection is no longer the server's: Close does not
	// wait for its handler, and the check that follows it.
	done := make(chan struct{}, 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		checked.ServeHTTP(w, r)
		done <- struct{}{}
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	for _, path := range []string{"/things/1/watch", "/things/1"} {
		c, _, err := websocket.Dial(ctx, "ws"+strings.TrimPrefix(srv.URL, "http")+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Read(ctx)
		c.Close(websocket.StatusNormalClosure, "")
		<-done
	}
	err = v.Err()
	if err == nil || !strings.Contains(err.Error(), "GET /things/{id} (getThing): answered 101, a status the operation does not document") {
		t.Fatalf("report %v, want the undocumented 101 alone", err)
	}
	if strings.Contains(err.Error(), "watch") {
		t.Errorf("the documented WebSocket reported: %v", err)
	}
}

// TestValidatorCounts reports each distinct mismatch once, with how often
// it came.
func TestValidatorCounts(t *testing.T) {
	v, err := NewValidator([]byte(thingsDocument))
	if err != nil {
		t.Fatal(err)
	}
	h := v.Wrap(answer(500, "application/json", `{}`))
	for range 3 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/things/1", nil))
	}
	err = v.Err()
	if err == nil || !strings.Contains(err.Error(), "3 answers did not match") || strings.Count(err.Error(), "answered 500") != 1 || !strings.Contains(err.Error(), "(3 times)") {
		t.Fatalf("report %v", err)
	}
}

// TestValidatorLoadsKilnd builds a Validator of kilnd's own document: its
// path templates make one ServeMux, and a request finds its operation.
func TestValidatorLoadsKilnd(t *testing.T) {
	v, err := NewValidator(api.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	for path, template := range map[string]string{
		"/sandboxes/s1":                     "/sandboxes/{id}",
		"/sandboxes/s1/files/workspace/a/b": "/sandboxes/{id}/files/{path}",
		"/images/registry.example:5000/a/b": "/images/{name}",
		"/images/pull":                      "/images/pull",
		"/sandboxes/s1/exec-stream/p1/wait": "/sandboxes/{id}/exec-stream/{pid}/wait",
		"/sandboxes/s1/ports/8080/a/b?c=d":  "/sandboxes/{id}/ports/{port}/{path}",
	} {
		h, _ := v.paths.Handler(httptest.NewRequest("GET", path, nil))
		if got, _ := h.(templateHandler); string(got) != template {
			t.Errorf("%s found %q, want %s", path, got, template)
		}
	}
}

// TestValidatorOwnServers: a path item with servers of its own describes
// the requests made to those alone (OwnServers tells them apart), and the
// others the requests made to the document's: a path is no operation on
// the other's servers, where only an error is the right answer.
func TestValidatorOwnServers(t *testing.T) {
	const doc = `
openapi: 3.0.3
info: {title: two servers, version: "1"}
servers: [{url: "http://api.example"}]
paths:
  /things:
    get:
      operationId: listThings
      responses:
        "200":
          description: the things
          content:
            application/json: {schema: {type: array, items: {type: string}}}
  /app/{path}:
    servers: [{url: "http://{app}.apps.example", variables: {app: {default: one}}}]
    parameters: [{name: path, in: path, required: true, schema: {type: string}}]
    get:
      operationId: app
      responses:
        default:
          description: the app's answer
          content:
            "*/*": {schema: {type: string, format: binary}}
components:
  responses:
    Error:
      description: an error
      content:
        application/json:
          schema: {type: object, required: [error], properties: {error: {type: object}}}
`
	v, err := NewValidator([]byte(doc))
	if err != nil {
		t.Fatal(err)
	}
	v.OwnServers = func(r *http.Request) bool { return strings.HasSuffix(r.Host, ".apps.example") }
	errJSON := Answer{Status: 404, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"error":{}}`)}
	page := Answer{Status: 200, Header: http.Header{"Content-Type": {"text/html"}}, Body: []byte("<p>app</p>")}
	list := Answer{Status: 200, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`["a"]`)}
	for _, tc := range []struct {
		host, path string
		a          Answer
		ok         bool
	}{
		{"one.apps.example", "/app/x", page, true},
		{"one.apps.example", "/things", errJSON, true},
		{"one.apps.example", "/things", list, false},
		{"api.example", "/things", list, true},
		{"api.example", "/app/x", errJSON, true},
		{"api.example", "/app/x", page, false},
	} {
		r := httptest.NewRequest("GET", "http://"+tc.host+tc.path, nil)
		if err := v.Check(r, tc.a); (err == nil) != tc.ok {
			t.Errorf("GET %s on %s answered %d %s: %v, want ok %v", tc.path, tc.host, tc.a.Status, tc.a.Header.Get("Content-Type"), err, tc.ok)
		}
	}
}

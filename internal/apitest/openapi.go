package apitest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
)

// Validator holds a server's real answers to its OpenAPI document: each
// answer's status must be one its operation documents, its Content-Type
// one the document gives for that status, and a JSON body (or each line
// of an NDJSON one) must match the schema. An answer to a request that
// no operation of the document describes must be an error, with the
// document's error body; a CORS preflight is left alone. Switching
// protocols (a WebSocket) and bodies of other types are checked for
// their status and type alone; so is a body larger than maxChecked, or
// one the client left before it was written.
//
// A path item that names servers of its own (OpenAPI's path-level
// servers) describes the requests made to those alone, and the others
// the requests made to the document's: OwnServers tells them apart.
//
// A Validator is safe for concurrent use; what did not match accumulates
// until Err reports it.
type Validator struct {
	doc *openapi3.T
	// paths finds a request's path item: the document's path templates as
	// ServeMux patterns, each the template it came from; own those of the
	// path items with servers of their own.
	paths, own *http.ServeMux
	// OwnServers, when set, reports whether a request was made to the
	// servers path items name of their own rather than the document's.
	// Unset, every request is the document's servers'. Set it before the
	// Validator checks anything.
	OwnServers func(*http.Request) bool
	// errorSchema is the body of every error (components/responses/Error).
	errorSchema *openapi3.SchemaRef

	// mu guards the mismatches.
	mu         sync.Mutex
	mismatches []string
	count      map[string]int
}

// maxChecked bounds the body a Validator keeps to check.
const maxChecked = 8 << 20

// maxMismatches bounds the distinct mismatches a Validator reports.
const maxMismatches = 50

// NewValidator reads an OpenAPI document (YAML or JSON), which must be
// valid, and returns its Validator.
func NewValidator(document []byte) (*Validator, error) {
	doc, err := openapi3.NewLoader().LoadFromData(document)
	if err != nil {
		return nil, fmt.Errorf("apitest: OpenAPI document: %w", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		return nil, fmt.Errorf("apitest: OpenAPI document: %w", err)
	}
	v := &Validator{doc: doc, paths: http.NewServeMux(), own: http.NewServeMux(), count: map[string]int{}}
	for template, item := range doc.Paths.Map() {
		mux := v.paths
		if len(item.Servers) > 0 {
			mux = v.own
		}
		mux.Handle(muxPattern(template), templateHandler(template))
	}
	if doc.Components != nil {
		if ref := doc.Components.Responses["Error"]; ref != nil && ref.Value != nil {
			if mt := ref.Value.Content.Get("application/json"); mt != nil {
				v.errorSchema = mt.Schema
			}
		}
	}
	if v.errorSchema == nil {
		return nil, errors.New("apitest: OpenAPI document: no components/responses/Error with an application/json schema")
	}
	return v, nil
}

// templateHandler carries a path template as the handler ServeMux
// finds for it; it is never served.
type templateHandler string

func (templateHandler) ServeHTTP(http.ResponseWriter, *http.Request) {}

var trailingParam = regexp.MustCompile(`\{([^}/]+)\}$`)

// muxPattern is a path template as a ServeMux pattern. A parameter that
// ends the template takes the rest of the path, slashes and all: a
// file's path, an image's name and a port's path have them, and a
// template that goes on after a parameter is more specific, so ServeMux
// still prefers it. (A path no template has below one that ends in a
// parameter, /sandboxes/ID/nothing, is so held to that template's
// operation; kilnd answers it 404, which they all document.)
func muxPattern(template string) string {
	if template == "/" {
		return "/{$}" // the root alone, not every path
	}
	return trailingParam.ReplaceAllString(template, "{$1...}")
}

// Wrap returns h with every answer it gives held to the document.
func (v *Validator) Wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		check := func(a Answer) {
			if err := v.Check(r, a); err != nil {
				v.record(err)
			}
		}
		rec := &recorder{ResponseWriter: w, hijack: check}
		h.ServeHTTP(rec, r)
		if !rec.hijacked {
			check(rec.answer())
		}
	})
}

// Answer is what a server answered, as a Validator checks it.
type Answer struct {
	Status int
	Header http.Header
	// Body is the body when it is to be checked: nil leaves it out, and
	// so does Partial (the client left, or it was too large to keep).
	Body    []byte
	Partial bool
	// Written counts the body's bytes, kept or not.
	Written int64
}

// Check holds one answer to the request to the document; its error says
// what did not match.
func (v *Validator) Check(r *http.Request, a Answer) error {
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		// A CORS preflight is the browser's, asked before any operation;
		// OpenAPI does not describe it.
		return nil
	}
	rt := v.routeOf(r)
	if rt.op == nil {
		// Nothing the document describes: an error is the right answer.
		where := fmt.Sprintf("%s %s", r.Method, clipText(r.URL.Path))
		if a.Status < 400 {
			return fmt.Errorf("%s: answered %d, and the document has no such operation", where, a.Status)
		}
		if err := v.checkJSON(a, v.errorSchema); err != nil {
			return fmt.Errorf("%s: answered %d: error body: %w", where, a.Status, err)
		}
		return nil
	}
	// Named by its template, not the path asked for: the same mismatch
	// for other IDs is counted as one.
	where := fmt.Sprintf("%s %s (%s)", r.Method, rt.template, rt.op.OperationID)
	resp := rt.op.Responses.Status(a.Status)
	if resp == nil {
		resp = rt.op.Responses.Default()
	}
	if resp == nil || resp.Value == nil {
		return fmt.Errorf("%s: answered %d, a status the operation does not document", where, a.Status)
	}
	if a.Status == http.StatusSwitchingProtocols || a.Status == http.StatusNoContent || a.Status == http.StatusNotModified {
		return nil
	}
	return v.checkContent(r, a, rt, where, resp.Value.Content)
}

// route is the operation of the document a request was made to, and
// where the document has it; op is nil when it has none.
type route struct {
	template string
	item     *openapi3.PathItem
	op       *openapi3.Operation
	// method is the request's, a HEAD taken as the GET it answers as.
	method string
}

// routeOf finds the operation r was made to, among the path items of the
// servers it was made to (OwnServers).
func (v *Validator) routeOf(r *http.Request) route {
	rt := route{method: r.Method}
	if rt.method == http.MethodHead {
		rt.method = http.MethodGet
	}
	paths := v.paths
	if v.OwnServers != nil && v.OwnServers(r) {
		paths = v.own
	}
	h, _ := paths.Handler(r)
	template, _ := h.(templateHandler)
	rt.template = string(template)
	if rt.template != "" {
		rt.item = v.doc.Paths.Value(rt.template)
	}
	if rt.item != nil {
		rt.op = rt.item.GetOperation(rt.method)
	}
	return rt
}

// checkContent holds an answer's Content-Type and body to content, what
// the document gives for its status; its errors begin with where, as
// Check's do.
func (v *Validator) checkContent(r *http.Request, a Answer, rt route, where string, content openapi3.Content) error {
	ct := a.Header.Get("Content-Type")
	if ct == "" && len(a.Body) > 0 {
		ct = http.DetectContentType(a.Body)
	}
	if a.Written == 0 && ct == "" {
		return nil
	}
	if len(content) == 0 {
		return fmt.Errorf("%s: answered %d with a body (%s) the document does not describe", where, a.Status, ct)
	}
	mt := content.Get(ct)
	if mt == nil {
		return fmt.Errorf("%s: answered %d with Content-Type %q; the document has %s", where, a.Status, ct, strings.Join(slices.Sorted(maps.Keys(content)), ", "))
	}
	base, _, _ := mime.ParseMediaType(ct)
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: r,
			Route:   &routers.Route{Spec: v.doc, Path: rt.template, PathItem: rt.item, Method: rt.method, Operation: rt.op},
		},
		Status: a.Status,
		Header: a.Header,
		Options: &openapi3filter.Options{
			IncludeResponseStatus: true,
			MultiError:            true,
			// Only JSON bodies are decoded and checked here.
			ExcludeResponseBody:     base != "application/json" || a.Body == nil || a.Partial,
			SchemaValidationOptions: []openapi3.SchemaValidationOption{openapi3.DisableSchemaErrorDetails()},
		},
	}
	in.SetBodyBytes(a.Body)
	if err := openapi3filter.ValidateResponse(r.Context(), in); err != nil {
		return fmt.Errorf("%s: answered %d: %w", where, a.Status, err)
	}
	if base == "application/x-ndjson" && a.Body != nil && mt.Schema != nil {
		if err := checkLines(a.Body, mt.Schema); err != nil {
			return fmt.Errorf("%s: answered %d: %w", where, a.Status, err)
		}
	}
	return nil
}

// checkJSON checks a JSON answer's body against schema; other answers
// pass.
func (v *Validator) checkJSON(a Answer, schema *openapi3.SchemaRef) error {
	base, _, _ := mime.ParseMediaType(a.Header.Get("Content-Type"))
	if base != "application/json" || a.Body == nil || a.Partial {
		return nil
	}
	var value any
	if err := json.Unmarshal(a.Body, &value); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return schema.Value.VisitJSON(value, openapi3.VisitAsResponse(), openapi3.MultiErrors(), openapi3.DisableSchemaErrorDetails())
}

// checkLines checks every complete line of an NDJSON body against
// schema; a last line without its newline is one the answer was cut
// short in.
func checkLines(body []byte, schema *openapi3.SchemaRef) error {
	for n := 1; ; n++ {
		line, rest, ok := bytes.Cut(body, []byte("\n"))
		if !ok {
			return nil
		}
		body = rest
		var value any
		if err := json.Unmarshal(line, &value); err != nil {
			return fmt.Errorf("line %d is not JSON: %w", n, err)
		}
		if err := schema.Value.VisitJSON(value, openapi3.VisitAsResponse(), openapi3.MultiErrors(), openapi3.DisableSchemaErrorDetails()); err != nil {
			return fmt.Errorf("line %d doesn't match schema %s: %w", n, schema.Ref, err)
		}
	}
}

func (v *Validator) record(err error) {
	msg := err.Error()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.count[msg]++; v.count[msg] == 1 && len(v.mismatches) < maxMismatches {
		v.mismatches = append(v.mismatches, msg)
	}
}

// Err reports every answer so far that did not match the document, each
// distinct mismatch once with how often it came; nil when all matched.
func (v *Validator) Err() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	if len(v.count) == 0 {
		return nil
	}
	var b strings.Builder
	n, answers := sum(v.count), "answers"
	if n == 1 {
		answers = "answer"
	}
	fmt.Fprintf(&b, "apitest: %d %s did not match the OpenAPI document:", n, answers)
	for _, m := range v.mismatches {
		if n := v.count[m]; n > 1 {
			fmt.Fprintf(&b, "\n\t%s (%d times)", m, n)
		} else {
			fmt.Fprintf(&b, "\n\t%s", m)
		}
	}
	if more := len(v.count) - len(v.mismatches); more > 0 {
		fmt.Fprintf(&b, "\n\tand %d more", more)
	}
	return errors.New(b.String())
}

func sum(m map[string]int) int {
	n := 0
	for _, c := range m {
		n += c
	}
	return n
}

func clipText(s string) string {
	if len(s) > 120 {
		return s[:120] + "…"
	}
	return s
}

// recorder passes an answer through and keeps what a Validator checks of
// it: the status, the header as it was sent and, for JSON and NDJSON, the
// body. It flushes and hijacks as the writer under it does; a hijacked
// answer is checked at once (hijack), as its connection may outlast
// the server.
type recorder struct {
	http.ResponseWriter
	hijack   func(Answer)
	status   int
	header   http.Header
	hijacked bool
	keep     bool
	body     bytes.Buffer
	written  int64
	partial  bool
}

func (w *recorder) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
		w.header = w.Header().Clone()
		base, _, _ := mime.ParseMediaType(w.header.Get("Content-Type"))
		w.keep = base == "" || base == "application/json" || base == "application/x-ndjson"
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *recorder) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.written += int64(n)
	if w.keep && !w.partial {
		if w.body.Len()+n > maxChecked {
			w.partial = true
		} else {
			w.body.Write(b[:n])
		}
	}
	if err != nil {
		w.partial = true
	}
	return n, err
}

func (w *recorder) Flush() {
	http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *recorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, brw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil && !w.hijacked {
		w.hijacked = true
		w.hijack(w.answer())
	}
	return conn, brw, err
}

// Unwrap lets http.ResponseController reach the writer's other methods.
func (w *recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// answer is what was answered. A connection hijacked before any status
// was written is taken to have switched protocols: a relay writes the
// 101 of the server it relays to itself.
func (w *recorder) answer() Answer {
	a := Answer{Status: w.status, Header: w.header, Written: w.written, Partial: w.partial}
	switch {
	case w.status == 0 && w.hijacked:
		a.Status = http.StatusSwitchingProtocols
	case w.status == 0:
		a.Status = http.StatusOK // what net/http sends for a handler that wrote nothing
	}
	if a.Header == nil {
		a.Header = w.Header().Clone()
	}
	if w.keep && !w.partial {
		a.Body = w.body.Bytes()
	}
	return a
}

package api_test

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v4"

	"github.com/sandkiln/sandkiln/api"
)

// asyncDoc is the AsyncAPI document as these tests read it: its
// channels, operations and messages, each $ref followed.
type asyncDoc struct {
	root       map[string]any
	channels   map[string]asyncChannel
	operations map[string]asyncOperation
	messages   map[string]asyncMessage // components/messages, by name
}

type asyncChannel struct {
	address string
	// messages are the channel's, by key: each a name of components/messages.
	messages map[string]string
	// query and headers are the handshake's, from the ws binding.
	query, headers *openapi3.Schema
}

type asyncOperation struct {
	action   string // send or receive, kilnd's side
	channel  string
	messages []string // names of components/messages
}

type asyncMessage struct {
	contentType string
	payload     *openapi3.Schema
	examples    []any // the examples' payloads
	// frame is a binary frame's header (x-kiln-frame): its fields in
	// order, with their sizes.
	frame []struct {
		Field string
		Bytes int
		Codes map[string]string
	}
}

// loadAsyncAPI reads api.AsyncAPI, the document kilnd serves.
func loadAsyncAPI(t *testing.T) *asyncDoc {
	t.Helper()
	var root map[string]any
	if err := yaml.Unmarshal(api.AsyncAPI, &root); err != nil {
		t.Fatalf("asyncapi.yaml: %v", err)
	}
	if v := root["asyncapi"]; v != "3.0.0" {
		t.Fatalf("asyncapi.yaml is AsyncAPI %v, want 3.0.0", v)
	}
	d := &asyncDoc{root: root, channels: map[string]asyncChannel{}, operations: map[string]asyncOperation{}, messages: map[string]asyncMessage{}}
	for name, m := range asMap(t, pointer(t, root, "#/components/messages")) {
		var msg struct {
			ContentType string
			Examples    []struct{ Payload any }
			Frame       []struct {
				Field string
				Bytes int
				Codes map[string]string
			} `json:"x-kiln-frame"`
		}
		decodeJSON(t, resolved(t, root, m), &msg)
		am := asyncMessage{contentType: msg.ContentType, payload: schemaOf(t, root, asMap(t, m)["payload"]), frame: msg.Frame}
		for _, e := range msg.Examples {
			am.examples = append(am.examples, e.Payload)
		}
		d.messages[name] = am
	}
	for id, c := range asMap(t, root["channels"]) {
		cm := asMap(t, c)
		ch := asyncChannel{messages: map[string]string{}}
		ch.address, _ = cm["address"].(string)
		for key, m := range asMap(t, cm["messages"]) {
			name := refName(t, m, "#/components/messages/")
			if _, ok := d.messages[name]; !ok {
				t.Fatalf("channel %s: message %s is not among the document's", id, name)
			}
			ch.messages[key] = name
		}
		if ws, ok := asMap(t, cm["bindings"])["ws"]; ok {
			if q, ok := asMap(t, ws)["query"]; ok {
				ch.query = schemaOf(t, root, q)
			}
			if h, ok := asMap(t, ws)["headers"]; ok {
				ch.headers = schemaOf(t, root, h)
			}
		}
		d.channels[id] = ch
	}
	for id, o := range asMap(t, root["operations"]) {
		om := asMap(t, o)
		op := asyncOperation{channel: refName(t, om["channel"], "#/channels/")}
		op.action, _ = om["action"].(string)
		list, _ := om["messages"].([]any)
		for _, m := range list {
			// #/channels/CHANNEL/messages/KEY
			ch, key, _ := strings.Cut(refName(t, m, "#/channels/"), "/messages/")
			name, ok := d.channels[ch].messages[key]
			if !ok {
				t.Fatalf("operation %s: no message %s in channel %s", id, key, ch)
			}
			op.messages = append(op.messages, name)
		}
		d.operations[id] = op
	}
	return d
}

func asMap(t *testing.T, v any) map[string]any {
	t.Helper()
	m, ok := v.(map[string]any)
	if !ok && v != nil {
		t.Fatalf("asyncapi.yaml: %v is no object", v)
	}
	return m
}

// refName is the part of a {$ref: …} after prefix.
func refName(t *testing.T, v any, prefix string) string {
	t.Helper()
	ref, _ := asMap(t, v)["$ref"].(string)
	name, ok := strings.CutPrefix(ref, prefix)
	if !ok {
		t.Fatalf("asyncapi.yaml: %v, want a $ref to %s…", v, prefix)
	}
	return name
}

// pointer is what a local $ref (#/a/b) points to.
func pointer(t *testing.T, root any, ref string) any {
	t.Helper()
	p, ok := strings.CutPrefix(ref, "#/")
	if !ok {
		t.Fatalf("asyncapi.yaml: $ref %s is not within the document", ref)
	}
	v := root
	for k := range strings.SplitSeq(p, "/") {
		if v, ok = asMap(t, v)[k]; !ok {
			t.Fatalf("asyncapi.yaml: $ref %s: no %s", ref, k)
		}
	}
	return v
}

// resolved is v with every $ref replaced by what it points to.
func resolved(t *testing.T, root, v any) any {
	t.Helper()
	switch v := v.(type) {
	case map[string]any:
		if ref, ok := v["$ref"].(string); ok && len(v) == 1 {
			return resolved(t, root, pointer(t, root, ref))
		}
		out := map[string]any{}
		for k, x := range v {
			out[k] = resolved(t, root, x)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, x := range v {
			out[i] = resolved(t, root, x)
		}
		return out
	}
	return v
}

func decodeJSON(t *testing.T, v, into any) {
	t.Helper()
	b, err := json.Marshal(v)
	if err == nil {
		err = json.Unmarshal(b, into)
	}
	if err != nil {
		t.Fatalf("asyncapi.yaml: %v: %v", v, err)
	}
}

// schemaOf reads an AsyncAPI schema, its $refs followed, as kin-openapi
// reads a schema: the document keeps to the JSON Schema both share, so
// that the OpenAPI document's checks hold it to the Go types too.
func schemaOf(t *testing.T, root, v any) *openapi3.Schema {
	t.Helper()
	if v == nil {
		return nil
	}
	s := &openapi3.Schema{}
	decodeJSON(t, resolved(t, root, v), s)
	return s
}

// asyncMessages are the Go types the document's messages describe, by
// name in components/messages, and who sends each. A JSON message's
// type is the Go type kilnd writes or reads; the others (bytes, and a
// raw watcher's lines of text) have none.
var asyncMessages = map[string]struct {
	typ reflect.Type
	dir string // "send" (kilnd sends it), "receive", or "both"
}{
	"hello":      {reflect.TypeFor[api.Hello](), "send"},
	"output":     {nil, "send"},
	"gap":        {reflect.TypeFor[api.Gap](), "send"},
	"end":        {reflect.TypeFor[api.End](), "send"},
	"exit":       {reflect.TypeFor[api.ExitMessage](), "send"},
	"stdin":      {nil, "receive"},
	"stdinClose": {reflect.TypeFor[api.ClientMessage](), "receive"},
	"resize":     {reflect.TypeFor[api.ClientMessage](), "receive"},
	"ack":        {reflect.TypeFor[api.ClientMessage](), "receive"},
	"credit":     {reflect.TypeFor[api.ClientMessage](), "receive"},
	"release":    {reflect.TypeFor[api.ClientMessage](), "receive"},
	"rawOutput":  {nil, "send"},
	"rawGap":     {nil, "send"},
	"rawExit":    {nil, "send"},
	"watchHello": {reflect.TypeFor[api.WatchHello](), "send"},
	"watchEvent": {reflect.TypeFor[api.FileEvent](), "send"},
	"watchGap":   {reflect.TypeFor[api.FileEvent](), "send"},
	"tcpBytes":   {nil, "both"},
	"event":      {reflect.TypeFor[api.Event](), "send"},
}

// TestAsyncAPIMessagesMatchTypes holds every message of the AsyncAPI
// document to the Go type it describes and to its direction: a JSON
// message's payload has the type's fields by JSON name, of the same JSON
// types, all the way down, and a message kilnd sends requires those
// always present. Where one Go type is several messages, one per value
// of "type" (a client's control messages, a watch's events and gaps),
// the messages together have its fields. Every example is valid for its
// payload, and decodes into the Go type without a field left over.
func TestAsyncAPIMessagesMatchTypes(t *testing.T) {
	d := loadAsyncAPI(t)
	for name := range d.messages {
		if _, ok := asyncMessages[name]; !ok {
			t.Errorf("message %s: no Go type holds it (asyncMessages)", name)
		}
	}
	byType := map[reflect.Type][]string{}
	for name, want := range asyncMessages {
		m, ok := d.messages[name]
		if !ok {
			t.Errorf("%s is not among the document's messages", name)
			continue
		}
		if m.payload == nil {
			t.Errorf("message %s has no payload", name)
			continue
		}
		isJSON := m.contentType == "" // the document's default, application/json
		if isJSON != (want.typ != nil) || isJSON != (m.payload.Type.Is("object") || len(m.payload.AllOf) > 0) {
			t.Errorf("message %s: content type %q, payload %v, for Go type %v", name, m.contentType, m.payload.Type.Slice(), want.typ)
		}
		if want.typ != nil {
			byType[want.typ] = append(byType[want.typ], name)
		}
		if isJSON && len(m.examples) == 0 {
			t.Errorf("message %s has no example", name)
		}
		for i, e := range m.examples {
			if err := m.payload.VisitJSON(e); err != nil {
				t.Errorf("message %s: example %d is not its payload: %v", name, i, err)
			}
			if want.typ != nil {
				b, _ := json.Marshal(e)
				dec := json.NewDecoder(bytes.NewReader(b))
				dec.DisallowUnknownFields()
				if err := dec.Decode(reflect.New(want.typ).Interface()); err != nil {
					t.Errorf("message %s: example %d is not a Go %s: %v", name, i, want.typ, err)
				}
			}
		}
	}
	for typ, names := range byType {
		slices.Sort(names)
		if len(names) == 1 {
			checkSchema(t, names[0], typ, d.messages[names[0]].payload, asyncMessages[names[0]].dir == "receive")
			continue
		}
		// One message per type value, their fields together the Go type's.
		all := &openapi3.Schema{Type: &openapi3.Types{"object"}, Properties: openapi3.Schemas{}}
		types := map[string]string{}
		for _, name := range names {
			p := flatten(d.messages[name].payload)
			maps.Copy(all.Properties, p.Properties)
			v := typeValues(p)
			if len(v) != 1 {
				t.Errorf("message %s: type %q, want one value", name, v)
				continue
			}
			if other, dup := types[v[0]]; dup {
				t.Errorf("messages %s and %s are both of type %s", name, other, v[0])
			}
			types[v[0]] = name
		}
		checkSchema(t, strings.Join(names, "+"), typ, all, true)
	}

	// Directions: a message is in the operations of its direction, and
	// only those.
	used := map[string]map[string]bool{}
	for id, op := range d.operations {
		if op.action != "send" && op.action != "receive" {
			t.Errorf("operation %s: action %q", id, op.action)
		}
		for _, name := range op.messages {
			if dir := asyncMessages[name].dir; dir != op.action && dir != "both" {
				t.Errorf("operation %s (%s) has message %s, which kilnd only does: %s", id, op.action, name, dir)
			}
			if used[name] == nil {
				used[name] = map[string]bool{}
			}
			used[name][op.action] = true
		}
	}
	for name, want := range asyncMessages {
		for _, action := range []string{"send", "receive"} {
			if (want.dir == action || want.dir == "both") && !used[name][action] {
				t.Errorf("message %s: in no %s operation", name, action)
			}
		}
	}
}

// typeValues are the values a payload allows its "type" property.
func typeValues(s *openapi3.Schema) []string {
	var out []string
	if p := s.Properties["type"]; p != nil {
		for _, v := range p.Value.Enum {
			s, _ := v.(string)
			out = append(out, s)
		}
	}
	return out
}

// channelTypes are the "type" values of the JSON messages of a channel,
// sorted.
func (d *asyncDoc) channelTypes(channel string) []string {
	var out []string
	for _, name := range d.channels[channel].messages {
		if p := d.messages[name].payload; p != nil {
			out = append(out, typeValues(flatten(p))...)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// constGroup returns the values of the string constants declared in the
// same const block as the constant name, in package api's source, by
// name: a constant added to the block is one the document must have.
func constGroup(t *testing.T, name string) map[string]string {
	t.Helper()
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			g, ok := decl.(*ast.GenDecl)
			if !ok || g.Tok != token.CONST {
				continue
			}
			group := map[string]string{}
			found := false
			for _, spec := range g.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, id := range vs.Names {
					found = found || id.Name == name
					if i < len(vs.Values) {
						if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
							group[id.Name], _ = strconv.Unquote(lit.Value)
						}
					}
				}
			}
			if found {
				return group
			}
		}
	}
	t.Fatalf("no const block declares %s", name)
	return nil
}

func sortedValues(m map[string]string) []string {
	out := slices.Sorted(maps.Values(m))
	return slices.Compact(out)
}

// enumOf is a schema's enum, as strings, sorted.
func enumOf(s *openapi3.Schema) []string {
	var out []string
	for _, v := range s.Enum {
		out = append(out, v.(string))
	}
	slices.Sort(out)
	return out
}

// channelProtocols are the subprotocols of the document's channels.
var channelProtocols = map[string]string{
	"outputV1":  api.ProtocolV1,
	"outputRaw": api.ProtocolRaw,
	"fileWatch": api.ProtocolWatch,
	"portTCP":   api.ProtocolTCP,
	"events":    api.ProtocolEvents,
}

// TestAsyncAPIConstants holds the document to the values of the API's
// constants, both ways, so that neither drifts: kiln.v1's message types
// (Type…), a files watch's (WatchType…) and its ops (File… of events),
// the streams' names and codes, the binary frame's header, and the
// subprotocols, each the channel's, whose Sec-WebSocket-Protocol pattern
// takes it (with the token protocol beside it) and no other channel's.
func TestAsyncAPIConstants(t *testing.T) {
	d := loadAsyncAPI(t)
	for _, c := range []struct {
		what      string
		doc, want []string
	}{
		{"kiln.v1 message types", d.channelTypes("outputV1"), sortedValues(constGroup(t, "TypeHello"))},
		{"a raw watcher's messages' types, the client's alone", d.channelTypes("outputRaw"), typesOf(d, "receiveInputV1")},
		{"files watch message types", d.channelTypes("fileWatch"), sortedValues(constGroup(t, "WatchTypeHello"))},
		{"file event ops", enumOf(d.messages["watchEvent"].payload.Properties["op"].Value), sortedValues(constGroup(t, "FileCreated"))},
		{"stream names", enumOf(pointerSchema(t, d, "#/components/schemas/Stream")), slices.Sorted(maps.Values(api.StreamNames))},
		{"offsets' stream names", propertyNames(t, d, "#/components/schemas/Offsets"), slices.Sorted(maps.Values(api.StreamNames))},
		{"hello's stream names", propertyNames(t, d, "#/components/schemas/Hello/properties/streams"), slices.Sorted(maps.Values(api.StreamNames))},
	} {
		if diff := cmp.Diff(c.want, c.doc); diff != "" {
			t.Errorf("%s: the API's (-) and the document's (+):\n%s", c.what, diff)
		}
	}

	// kiln.v1's binary frame: the header's size and the streams' codes.
	frame := d.messages["output"].frame
	size := 0
	for _, f := range frame {
		size += f.Bytes
	}
	if size != api.FrameHeader || len(frame) == 0 || frame[0].Field != "stream" || frame[0].Bytes != 1 {
		t.Errorf("the output frame's header: %+v, want %d bytes, the stream's code first", frame, api.FrameHeader)
	} else {
		codes := map[string]string{}
		for code, name := range api.StreamNames {
			codes[strconv.Itoa(int(code))] = name
		}
		if diff := cmp.Diff(codes, frame[0].Codes); diff != "" {
			t.Errorf("stream codes, the API's (-) and the document's (+):\n%s", diff)
		}
	}

	protocols := constGroup(t, "ProtocolV1")
	delete(protocols, "TokenProtocolPrefix")
	if diff := cmp.Diff(sortedValues(protocols), sortedValues(channelProtocols)); diff != "" {
		t.Errorf("subprotocols, the API's (-) and the channels' (+):\n%s", diff)
	}
	for id, ch := range d.channels {
		proto, ok := channelProtocols[id]
		if !ok {
			t.Errorf("channel %s: no subprotocol (channelProtocols)", id)
			continue
		}
		var h *openapi3.SchemaRef
		if ch.headers != nil {
			h = ch.headers.Properties["Sec-WebSocket-Protocol"]
		}
		if h == nil || h.Value.Pattern == "" {
			t.Errorf("channel %s: no Sec-WebSocket-Protocol pattern", id)
			continue
		}
		re, err := regexp.Compile(h.Value.Pattern)
		if err != nil {
			t.Errorf("channel %s: %v", id, err)
			continue
		}
		for _, offer := range []string{proto, proto + ", " + api.TokenProtocolPrefix + "secret", api.TokenProtocolPrefix + "secret, " + proto} {
			if !re.MatchString(offer) {
				t.Errorf("channel %s: its pattern %q refuses the offer %q", id, re, offer)
			}
		}
		for other, p := range channelProtocols {
			if p != proto && re.MatchString(p) {
				t.Errorf("channel %s: its pattern %q takes %s, channel %s's", id, re, p, other)
			}
		}
	}
	if desc, _ := asMap(t, pointer(t, d.root, "#/components/securitySchemes/tokenProtocol"))["description"].(string); !strings.Contains(desc, api.TokenProtocolPrefix+"TOKEN") {
		t.Errorf("the token protocol's description %q does not name %sTOKEN", desc, api.TokenProtocolPrefix)
	}

	// A raw watcher's last line is the exit as api.Exit says it.
	code0, code137 := 0, 137
	for _, e := range []api.Exit{{ExitCode: &code0}, api.SignalExit("TERM"), {ExitCode: &code137, Signal: "KILL", OOMKilled: true}, {}} {
		if line := "[" + e.String() + "]\n"; d.messages["rawExit"].payload.VisitJSON(line) != nil {
			t.Errorf("the raw exit line %q is not the rawExit message's", line)
		}
	}
}

// typesOf are the "type" values of an operation's JSON messages, sorted.
func typesOf(d *asyncDoc, op string) []string {
	var out []string
	for _, name := range d.operations[op].messages {
		if p := d.messages[name].payload; p != nil {
			out = append(out, typeValues(flatten(p))...)
		}
	}
	slices.Sort(out)
	return out
}

func pointerSchema(t *testing.T, d *asyncDoc, ref string) *openapi3.Schema {
	t.Helper()
	return schemaOf(t, d.root, pointer(t, d.root, ref))
}

// propertyNames are the names an object schema's propertyNames allows,
// sorted.
func propertyNames(t *testing.T, d *asyncDoc, ref string) []string {
	t.Helper()
	var s struct{ PropertyNames struct{ Enum []string } }
	decodeJSON(t, resolved(t, d.root, pointer(t, d.root, ref)), &s)
	slices.Sort(s.PropertyNames.Enum)
	return s.PropertyNames.Enum
}

// TestAsyncAPIBounds holds the bounds the document gives to the API's,
// which the agent enforces.
func TestAsyncAPIBounds(t *testing.T) {
	d := loadAsyncAPI(t)
	prop := func(message, name string) *openapi3.Schema {
		t.Helper()
		p := d.messages[message].payload.Properties[name]
		if p == nil {
			t.Fatalf("message %s has no property %s", message, name)
		}
		return p.Value
	}
	for _, b := range []struct {
		where    string
		s        *openapi3.Schema
		min, max float64
	}{
		{"resize.cols", prop("resize", "cols"), 1, api.MaxTTYSize},
		{"resize.rows", prop("resize", "rows"), 1, api.MaxTTYSize},
		{"credit.bytes", prop("credit", "bytes"), 1, api.MaxCredit},
		{"outputV1's query credit", d.channels["outputV1"].query.Properties["credit"].Value, api.CreditFrame, api.MaxCredit},
	} {
		if b.s.Min == nil || *b.s.Min != b.min || b.s.Max == nil || *b.s.Max != b.max {
			t.Errorf("%s: %s to %s, want %v to %v", b.where, bound(b.s.Min), bound(b.s.Max), b.min, b.max)
		}
	}
	desc, _ := asMap(t, pointer(t, d.root, "#/channels/outputV1"))["description"].(string)
	if !strings.Contains(strings.Join(strings.Fields(desc), " "), strconv.Itoa(api.MaxWSClient)+" bytes") {
		t.Errorf("outputV1's description does not give a client's largest message, %d bytes", api.MaxWSClient)
	}
}

func bound(v *float64) string {
	if v == nil {
		return "none"
	}
	return strconv.FormatFloat(*v, 'g', -1, 64)
}

// TestAsyncAPIChannelsAreRoutes holds the channels to the OpenAPI
// document's routes: each channel's address is a GET that switches
// protocols, and its handshake's query parameters are that operation's;
// every route that switches to a WebSocket of kilnd's (not an app's,
// through a port's proxy) is a channel's address.
func TestAsyncAPIChannelsAreRoutes(t *testing.T) {
	d := loadAsyncAPI(t)
	addresses := map[string]bool{}
	for id, ch := range d.channels {
		addresses[ch.address] = true
		item := loadOpenAPI(t).Paths.Find(ch.address)
		if item == nil || item.Get == nil || item.Get.Responses.Value("101") == nil {
			t.Errorf("channel %s: %s is no GET of the OpenAPI document that switches protocols", id, ch.address)
			continue
		}
		params := map[string]bool{}
		for _, p := range item.Get.Parameters {
			if p.Value.In == "query" {
				params[p.Value.Name] = true
			}
		}
		if ch.query != nil {
			for name := range ch.query.Properties {
				if !params[name] {
					t.Errorf("channel %s: query %s is not a parameter of GET %s", id, name, ch.address)
				}
			}
		}
	}
	for path, item := range loadOpenAPI(t).Paths.Map() {
		if item.Get == nil {
			continue
		}
		r := item.Get.Responses.Value("101")
		if r == nil || strings.Contains(*r.Value.Description, "app's") {
			continue
		}
		if !addresses[path] {
			t.Errorf("GET %s switches to a WebSocket no channel describes", path)
		}
	}
}

package api_test

import (
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandkiln/sandkiln/api"
)

func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return doc
}

// TestOpenAPIValid holds the OpenAPI document to the specification as a
// third-party validator reads it: an unquoted description with a comma in
// a YAML flow map, say, becomes a stray key, which kin-openapi refuses.
func TestOpenAPIValid(t *testing.T) {
	doc := loadOpenAPI(t)
	if err := doc.Validate(t.Context()); err != nil {
		t.Fatalf("the document is not valid OpenAPI %s: %v", doc.OpenAPI, err)
	}
	if n := len(doc.Paths.Map()); n < 25 {
		t.Errorf("%d paths, want every route's", n)
	}
	// Every operation named, once: a generated client's methods.
	seen := map[string]string{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			where := method + " " + path
			if op.OperationID == "" {
				t.Errorf("%s has no operationId", where)
			} else if other, dup := seen[op.OperationID]; dup {
				t.Errorf("%s and %s are both %s", where, other, op.OperationID)
			}
			seen[op.OperationID] = where
		}
	}
}

// wireTypes are the Go types the document's schemas describe, by schema
// name. A request's schema requires what the server refuses without, set
// by hand; a response's requires every field that is always present
// (without omitempty or omitzero).
var wireTypes = map[string]struct {
	typ     reflect.Type
	request bool
}{
	"Sandbox":         {reflect.TypeFor[api.Sandbox](), false},
	"Node":            {reflect.TypeFor[api.Node](), false},
	"Health":          {reflect.TypeFor[api.Health](), false},
	"DrainRequest":    {reflect.TypeFor[api.DrainRequest](), true},
	"MovedSandbox":    {reflect.TypeFor[api.MovedSandbox](), false},
	"Event":           {reflect.TypeFor[api.Event](), false},
	"SandboxStats":    {reflect.TypeFor[api.SandboxStats](), false},
	"TopProcess":      {reflect.TypeFor[api.TopProcess](), false},
	"CreateSandbox":   {reflect.TypeFor[api.CreateSandbox](), true},
	"LogRotation":     {reflect.TypeFor[api.LogRotation](), true},
	"Mount":           {reflect.TypeFor[api.Mount](), true},
	"Limits":          {reflect.TypeFor[api.Limits](), false},
	"Version":         {reflect.TypeFor[api.Version](), false},
	"AgentCounts":     {reflect.TypeFor[api.AgentCounts](), false},
	"Network":         {reflect.TypeFor[api.Network](), false},
	"ExecRequest":     {reflect.TypeFor[api.ExecRequest](), true},
	"TTY":             {reflect.TypeFor[api.TTY](), true},
	"Exit":            {reflect.TypeFor[api.Exit](), false},
	"ExecResult":      {reflect.TypeFor[api.ExecResult](), false},
	"Started":         {reflect.TypeFor[api.Started](), false},
	"Process":         {reflect.TypeFor[api.Process](), false},
	"StreamStatus":    {reflect.TypeFor[api.StreamStatus](), false},
	"Snapshot":        {reflect.TypeFor[api.Snapshot](), false},
	"SnapshotRequest": {reflect.TypeFor[api.SnapshotRequest](), true},
	"RollbackRequest": {reflect.TypeFor[api.RollbackRequest](), true},
	"ForkRequest":     {reflect.TypeFor[api.ForkRequest](), true},
	"Forked":          {reflect.TypeFor[api.Forked](), false},
	"ForkedFrom":      {reflect.TypeFor[api.ForkedFrom](), false},
	"StdinStatus":     {reflect.TypeFor[api.StdinStatus](), false},
	"StdinAccepted":   {reflect.TypeFor[api.StdinAccepted](), false},
	"SignalRequest":   {reflect.TypeFor[api.SignalRequest](), true},
	"Error":           {reflect.TypeFor[api.Error](), false},
	"ErrorBody":       {reflect.TypeFor[api.ErrorBody](), false},
	"ErrorCode":       {reflect.TypeFor[string](), false},
	"Image":           {reflect.TypeFor[api.Image](), false},
	"ImageConfig":     {reflect.TypeFor[api.ImageConfig](), false},
	"PullImage":       {reflect.TypeFor[api.PullImage](), true},
	"ImageProgress":   {reflect.TypeFor[api.ImageProgress](), false},
	"ImageRemoval":    {reflect.TypeFor[api.ImageRemoval](), false},
	"CapturedLog":     {reflect.TypeFor[api.CapturedLog](), false},
	"Run":             {reflect.TypeFor[api.Run](), false},
	"LogStats":        {reflect.TypeFor[api.LogStats](), false},
	"LogRecord":       {reflect.TypeFor[api.LogRecord](), false},
	"FileInfo":        {reflect.TypeFor[api.FileInfo](), false},
	"FileEvent":       {reflect.TypeFor[api.FileEvent](), false},
	"WatchHello":      {reflect.TypeFor[api.WatchHello](), false},
	"CreatePreview":   {reflect.TypeFor[api.CreatePreview](), true},
	"Preview":         {reflect.TypeFor[api.Preview](), false},
	"Hello":           {reflect.TypeFor[api.Hello](), false},
	"HelloSpan":       {reflect.TypeFor[api.HelloSpan](), false},
	"Gap":             {reflect.TypeFor[api.Gap](), false},
	"End":             {reflect.TypeFor[api.End](), false},
	"ExitMessage":     {reflect.TypeFor[api.ExitMessage](), false},
	"ClientMessage":   {reflect.TypeFor[api.ClientMessage](), true},
}

// TestOpenAPISchemasMatchTypes holds every schema of the document to the
// Go type it describes: the same fields by JSON name, of the same JSON
// types, all the way down, and a response's required fields those
// always present. A field added to a wire type and not to the document
// fails here.
func TestOpenAPISchemasMatchTypes(t *testing.T) {
	schemas := loadOpenAPI(t).Components.Schemas
	for name, ref := range schemas {
		w, ok := wireTypes[name]
		if !ok {
			t.Errorf("schema %s: no Go type holds it (wireTypes)", name)
			continue
		}
		checkSchema(t, name, w.typ, ref.Value, w.request)
	}
	for name := range wireTypes {
		if schemas[name] == nil {
			t.Errorf("%s is not among the document's schemas", name)
		}
	}
	// A create's limits are a LimitsRequest, each left out for kilnd's
	// default.
	checkSchema(t, "Limits (a request's)", reflect.TypeFor[api.LimitsRequest](), schemas["Limits"].Value, true)
}

// TestOpenAPIErrorCodes holds the document's error codes to the API's.
func TestOpenAPIErrorCodes(t *testing.T) {
	codes := []string{api.CodeInvalid, api.CodeUnauthorized, api.CodeForbidden, api.CodeNotFound, api.CodeMethod,
		api.CodeConflict, api.CodeTooLarge, api.CodeOutOfRange, api.CodePrecondition, api.CodeUnavailable,
		api.CodeUnknown, api.CodeInternal, api.CodeBadGateway, api.CodeCommandNotFound, api.CodeNotExecutable, api.CodeNoSpace, api.CodePaused}
	var enum []string
	for _, v := range loadOpenAPI(t).Components.Schemas["ErrorCode"].Value.Enum {
		enum = append(enum, v.(string))
	}
	slices.Sort(codes)
	slices.Sort(enum)
	if !slices.Equal(enum, codes) {
		t.Errorf("ErrorCode's enum %q, want the API's codes %q", enum, codes)
	}
}

// TestOpenAPIRanges holds the ranges the document gives to the API's
// bounds, which kilnd and the agent enforce: each bound in the schema
// where a validator reads it, and a range that ends at what the host has
// (cpus, memory_bytes) spelled out in the field's description.
func TestOpenAPIRanges(t *testing.T) {
	schemas := loadOpenAPI(t).Components.Schemas
	prop := func(schema, name string) *openapi3.Schema {
		t.Helper()
		s := schemas[schema].Value.Properties[name]
		if s == nil {
			t.Fatalf("%s has no property %s", schema, name)
		}
		return s.Value
	}
	for _, b := range []struct {
		schema, name string
		min, max     float64 // NaN: none
		says         []string
	}{
		{"Limits", "cpus", 0, math.NaN(), []string{"0.01", "the host's CPUs", "0 for none"}},
		{"Limits", "memory_bytes", 0, math.NaN(), []string{"4194304", "the host's memory", "0 for none"}},
		{"Limits", "pids", 0, api.MaxPids, []string{"1 to 4194304", "0 for none"}},
		{"Limits", "disk_bytes", 0, api.MaxDiskBytes, []string{"67108864", "17592186044416", "0 for none", "507"}},
		{"CreateSandbox", "idle_timeout_seconds", 0, api.MaxIdleTimeoutSeconds, nil},
		{"ExecRequest", "timeout_ms", 0, api.MaxTimeoutMS, nil},
		{"ExecRequest", "drain_ms", 0, api.MaxDrainMS, nil},
		{"ExecRequest", "max_output_bytes", 0, api.DefaultMaxOutput, nil},
		{"ExecRequest", "user", math.NaN(), math.NaN(), nil},
		{"TTY", "cols", 1, api.MaxTTYSize, nil},
		{"TTY", "rows", 1, api.MaxTTYSize, nil},
		{"LogRotation", "max_size_bytes", api.MinLogFileSize, api.MaxLogFileSize, nil},
		{"LogRotation", "max_files", api.MinLogFiles, api.MaxLogFiles, nil},
	} {
		s := prop(b.schema, b.name)
		where := b.schema + "." + b.name
		for _, end := range []struct {
			what string
			got  *float64
			want float64
		}{{"minimum", s.Min, b.min}, {"maximum", s.Max, b.max}} {
			switch {
			case math.IsNaN(end.want) && end.got != nil:
				t.Errorf("%s: %s %v, want none", where, end.what, *end.got)
			case !math.IsNaN(end.want) && (end.got == nil || *end.got != end.want):
				t.Errorf("%s: %s %v, want %v", where, end.what, end.got, end.want)
			}
		}
		for _, w := range b.says {
			if !strings.Contains(s.Description, w) {
				t.Errorf("%s: the description %q does not say %q", where, s.Description, w)
			}
		}
	}
	if got := prop("ExecRequest", "user").MaxLength; got == nil || *got != api.MaxUser {
		t.Errorf("ExecRequest.user: maxLength %v, want %d", got, api.MaxUser)
	}
}

// checkSchema holds schema s to Go type typ, as encoding/json writes it.
func checkSchema(t *testing.T, where string, typ reflect.Type, s *openapi3.Schema, request bool) {
	t.Helper()
	for typ.Kind() == reflect.Pointer {
		typ = typ.Elem()
	}
	s = flatten(s)
	want := ""
	switch typ.Kind() {
	case reflect.String:
		want = "string"
	case reflect.Bool:
		want = "boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		want = "integer"
	case reflect.Float32, reflect.Float64:
		want = "number"
	case reflect.Slice:
		want = "array"
	case reflect.Map, reflect.Struct:
		want = "object"
	}
	if typ == reflect.TypeFor[time.Time]() {
		want = "string"
		if s.Format != "date-time" {
			t.Errorf("%s: a time, format %q, want date-time", where, s.Format)
		}
	}
	if !s.Type.Is(want) {
		t.Errorf("%s: type %v, want %s (Go %s)", where, s.Type.Slice(), want, typ)
		return
	}
	switch {
	case want == "array":
		if s.Items == nil {
			t.Errorf("%s: an array without items", where)
			return
		}
		checkSchema(t, where+"[]", typ.Elem(), s.Items.Value, request)
	case typ.Kind() == reflect.Map:
		if s.AdditionalProperties.Schema == nil {
			t.Errorf("%s: a map without additionalProperties", where)
			return
		}
		checkSchema(t, where+"{}", typ.Elem(), s.AdditionalProperties.Schema.Value, request)
	case typ.Kind() == reflect.Struct && want == "object":
		fields := jsonFields(typ)
		for name, f := range fields {
			p := s.Properties[name]
			if p == nil {
				t.Errorf("%s: no property %s (Go %s.%s)", where, name, typ.Name(), f.goName)
				continue
			}
			checkSchema(t, where+"."+name, f.typ, p.Value, request)
			if required := slices.Contains(s.Required, name); !request && required == f.omitted {
				presence := "is always present"
				if f.omitted {
					presence = "may be left out (omitempty)"
				}
				t.Errorf("%s.%s: required is %v, but Go's %s.%s %s", where, name, required, typ.Name(), f.goName, presence)
			}
		}
		for name := range s.Properties {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s: property %s is no field of Go's %s", where, name, typ.Name())
			}
		}
		for _, name := range s.Required {
			if _, ok := fields[name]; !ok {
				t.Errorf("%s: requires %s, no field of Go's %s", where, name, typ.Name())
			}
		}
	}
}

// flatten merges an allOf's schemas (an embedded struct's and the
// fields beside it) into one object schema.
func flatten(s *openapi3.Schema) *openapi3.Schema {
	if len(s.AllOf) == 0 {
		return s
	}
	out := &openapi3.Schema{Type: &openapi3.Types{"object"}, Properties: openapi3.Schemas{}}
	for _, part := range s.AllOf {
		p := flatten(part.Value)
		for k, v := range p.Properties {
			out.Properties[k] = v
		}
		out.Required = append(out.Required, p.Required...)
	}
	return out
}

type jsonField struct {
	goName  string
	typ     reflect.Type
	omitted bool // omitempty or omitzero: not always present
}

// jsonFields are the fields encoding/json writes of struct type typ, by
// name, an embedded struct's among them.
func jsonFields(typ reflect.Type) map[string]jsonField {
	out := map[string]jsonField{}
	for f := range typ.Fields() {
		tag := f.Tag.Get("json")
		if tag == "-" || !f.IsExported() && !f.Anonymous {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			for k, v := range jsonFields(f.Type) {
				out[k] = v
			}
			continue
		}
		if name == "" {
			name = f.Name
		}
		omitted := slices.ContainsFunc(strings.Split(opts, ","), func(o string) bool { return o == "omitempty" || o == "omitzero" })
		out[name] = jsonField{goName: f.Name, typ: f.Type, omitted: omitted}
	}
	return out
}

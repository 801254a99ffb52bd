package api_test

import (
	"testing"

	"github.com/getkin/kin-openapi/openapi3"

	"github.com/sandkiln/sandkiln/api"
)

// TestOpenAPIValid holds the OpenAPI document to the specification as a
// third-party validator reads it: an unquoted description with a comma in
// a YAML flow map, say, becomes a stray key, which kin-openapi refuses.
func TestOpenAPIValid(t *testing.T) {
	doc, err := openapi3.NewLoader().LoadFromData(api.OpenAPI)
	if err != nil {
		t.Fatalf("load: %v", err)
	}
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

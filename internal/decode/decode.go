// Package decode reads the JSON bodies of kilnd's and the agent's requests: one bound, unknown fields refused, one error shape.
package decode

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// ErrMalformed is a body that is not the one JSON value asked for; every
// refusal of Body but a body too large wraps it.
var ErrMalformed = errdefs.New(errdefs.ErrInvalidArgument, "malformed request")

// Body reads r's JSON body into v: at most api.MaxBody bytes, one value
// of v's type with none of the fields it lacks, nothing after it. An
// empty body leaves v as it is, the zero value a handler starts from, so
// that POST /sandboxes with no body is a create with every default.
//
// Its errors are errdefs classes the transport answers alone (package
// reply): a body past the bound is too large (413), wrapping the
// http.MaxBytesError; anything else wraps ErrMalformed (400) and the
// decoder's error, which names the field or the offset.
func Body(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, api.MaxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil && !errors.Is(err, io.EOF) {
		return refusal(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var maxErr *http.MaxBytesError
		if errors.As(err, &maxErr) {
			return refusal(err)
		}
		return fmt.Errorf("%w: data after the JSON value", ErrMalformed)
	}
	return nil
}

// refusal is the error a decoder's err is answered with.
func refusal(err error) error {
	var maxErr *http.MaxBytesError
	if errors.As(err, &maxErr) {
		return fmt.Errorf("%w: request body over %d bytes: %w", errdefs.ErrTooLarge, maxErr.Limit, err)
	}
	return fmt.Errorf("%w: %w", ErrMalformed, err)
}

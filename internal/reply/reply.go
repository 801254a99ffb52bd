// Package reply writes kilnd's and the agent's HTTP answers: JSON bodies and the one error shape.
package reply

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/sandkiln/sandkiln/api"
	"github.com/sandkiln/sandkiln/internal/errdefs"
)

// JSON writes v as the JSON body of a response with status.
func JSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	enc.Encode(v)
}

type answer struct {
	code   string
	status int
}

// answers is each error class's API code and HTTP status: the one place
// where an error becomes an answer.
var answers = map[*errdefs.Class]answer{
	errdefs.ErrInvalidArgument:    {api.CodeInvalid, http.StatusBadRequest},
	errdefs.ErrUnauthenticated:    {api.CodeUnauthorized, http.StatusUnauthorized},
	errdefs.ErrPermissionDenied:   {api.CodeForbidden, http.StatusForbidden},
	errdefs.ErrNotFound:           {api.CodeNotFound, http.StatusNotFound},
	errdefs.ErrMethodNotAllowed:   {api.CodeMethod, http.StatusMethodNotAllowed},
	errdefs.ErrAlreadyExists:      {api.CodeConflict, http.StatusConflict},
	errdefs.ErrTooLarge:           {api.CodeTooLarge, http.StatusRequestEntityTooLarge},
	errdefs.ErrNoSpace:            {api.CodeNoSpace, http.StatusInsufficientStorage},
	errdefs.ErrOutOfRange:         {api.CodeOutOfRange, http.StatusRequestedRangeNotSatisfiable},
	errdefs.ErrFailedPrecondition: {api.CodePrecondition, http.StatusPreconditionFailed},
	errdefs.ErrUnavailable:        {api.CodeUnavailable, http.StatusServiceUnavailable},
	errdefs.ErrOutcomeUnknown:     {api.CodeUnknown, http.StatusBadGateway},
	errdefs.ErrInternal:           {api.CodeInternal, http.StatusInternalServerError},
	errdefs.ErrBadGateway:         {api.CodeBadGateway, http.StatusBadGateway},
	errdefs.ErrCommandNotFound:    {api.CodeCommandNotFound, http.StatusBadRequest},
	errdefs.ErrNotExecutable:      {api.CodeNotExecutable, http.StatusBadRequest},
	errdefs.ErrPaused:             {api.CodePaused, http.StatusConflict},
}

// Code returns the API code and HTTP status err answers with: those of its
// class (errdefs.ClassOf). A body past its http.MaxBytesReader bound, of no
// class of its own, is too large; any other error of no class is internal.
func Code(err error) (code string, status int) {
	c := errdefs.ClassOf(err)
	var maxErr *http.MaxBytesError
	if c == nil && errors.As(err, &maxErr) {
		c = errdefs.ErrTooLarge
	}
	a, ok := answers[c]
	if !ok {
		a = answers[errdefs.ErrInternal]
	}
	return a.code, a.status
}

// Error answers with err: its code and status (see Code), and its message.
func Error(w http.ResponseWriter, err error) {
	code, status := Code(err)
	w.Header().Set(api.ErrorHeader, code)
	JSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: err.Error()}})
}

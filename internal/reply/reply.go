// Package reply writes kilnd's and the agent's HTTP answers: JSON bodies and the one error shape.
package reply

import (
	"encoding/json"
	"net/http"

	"github.com/sandkiln/sandkiln/api"
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

// Status is the HTTP status of each error code.
var Status = map[string]int{
	api.CodeInvalid:      http.StatusBadRequest,
	api.CodeUnauthorized: http.StatusUnauthorized,
	api.CodeForbidden:    http.StatusForbidden,
	api.CodeNotFound:     http.StatusNotFound,
	api.CodeMethod:       http.StatusMethodNotAllowed,
	api.CodeConflict:     http.StatusConflict,
	api.CodePrecondition: http.StatusPreconditionFailed,
	api.CodeTooLarge:     http.StatusRequestEntityTooLarge,
	api.CodeOutOfRange:   http.StatusRequestedRangeNotSatisfiable,
	api.CodeUnavailable:  http.StatusServiceUnavailable,
	api.CodeUnknown:      http.StatusBadGateway,
	api.CodeInternal:     http.StatusInternalServerError,
}

// Error writes the error body for code with its status.
func Error(w http.ResponseWriter, code, message string) {
	status, ok := Status[code]
	if !ok {
		status, code = http.StatusInternalServerError, api.CodeInternal
	}
	JSON(w, status, api.Error{Error: api.ErrorBody{Code: code, Message: message}})
}

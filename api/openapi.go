package api

import _ "embed"

// OpenAPI is kilnd's API described in OpenAPI 3 (the file openapi.yaml),
// served at GET /openapi.yaml. A test holds it against the real routes.
//
//go:embed openapi.yaml
var OpenAPI []byte

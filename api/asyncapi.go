package api

import _ "embed"

// AsyncAPI describes kilnd's WebSockets in AsyncAPI 3 (the file
// asyncapi.yaml): the kiln.v1 and raw output, files watches and TCP
// connections to a port, each message with its direction and fields.
// Served at GET /asyncapi.yaml; a test holds it against the types here.
//
//go:embed asyncapi.yaml
var AsyncAPI []byte

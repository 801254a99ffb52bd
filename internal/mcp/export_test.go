package mcp

import "github.com/sandkiln/sandkiln/client"

// For the tests of package mcp_test.
var (
	PartialRune  = partialRune
	PartialStart = partialStart
	LastBytes    = lastBytes
	LogURI       = logURI
	ParseLogURI  = parseLogURI
	NewPage      = newPage
)

func (pg *page) Add(ch client.Chunk) bool        { return pg.add(ch) }
func (pg *page) Data() map[string][]byte         { return pg.data }
func (pg *page) Next() map[string]int64          { return pg.next }
func (pg *page) Lost() map[string]int64          { return pg.lost }
func (pg *page) Taken() int                      { return pg.taken }
func (pg *page) Cut() bool                       { return pg.cut }
func (pg *page) Hold()                           { pg.hold() }
func (pg *page) Reached(t map[string]int64) bool { return pg.reached(t) }

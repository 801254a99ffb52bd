package egress

// Nameservers is nameservers, for the tests.
var Nameservers = nameservers

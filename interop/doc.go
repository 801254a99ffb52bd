// Package interop holds sandkiln's files and streams against the tools users read them with: kubelet's CRI log reader, and others.
package interop

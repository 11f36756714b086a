// Package cee is not named like the last element of its import path (v2).
package cee

// Code is a named basic type.
type Code int32

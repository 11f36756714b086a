// Package value is a golden case of mwrpcgen (-type Calc): requests and responses passed
// by value, structs and basic types, named and aliased.
package value

import "context"

// Calc computes.
type Calc interface {
	// Add returns A+B.
	Add(ctx context.Context, req Pair) (int64, error)
	// Swap returns the pair swapped.
	Swap(ctx context.Context, req Pair) (Pair, error)
	// Upper works on strings.
	Upper(ctx context.Context, s string) (string, error)
	// Half works on floats.
	Half(ctx context.Context, x float64) (float32, error)
	// Valid works on named and aliased basic types.
	Valid(ctx context.Context, id ID) (bool, error)
	// Level takes an alias of string and returns a named uint8.
	Level(ctx context.Context, name Name) (Level, error)
	// Nothing takes and returns empty structs.
	Nothing(ctx context.Context, req struct{}) (struct{}, error)
}

// Pair is two numbers.
type Pair struct{ A, B int64 }

// ID is a named basic type.
type ID uint32

// Name is an alias of string.
type Name = string

// Level is a named uint8.
type Level uint8

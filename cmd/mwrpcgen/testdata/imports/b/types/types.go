// Package types (b) has the same name as package types (a).
package types

// Item is an entry.
type Item struct{ ID int }

// Filter selects items.
type Filter struct{ Prefix string }

package controller_test

import (
	"sync"
)

type atomicString struct {
	mu sync.Mutex
	s  string
}

func (a *atomicString) Load() string   { a.mu.Lock(); defer a.mu.Unlock(); return a.s }
func (a *atomicString) Store(s string) { a.mu.Lock(); defer a.mu.Unlock(); a.s = s }

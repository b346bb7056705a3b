package audit

import "sync"

// slabPool hands out backing arrays that a parser fills and drops once a
// file is done, so that each worker reuses a few large arrays instead of
// allocating (and collecting) them for every file. Whoever puts an array
// back must hold no pointer into it any more.
type slabPool[T any] struct{ p sync.Pool }

func (s *slabPool[T]) get(n int) []T {
	if v, ok := s.p.Get().(*[]T); ok && cap(*v) >= n {
		return (*v)[:0]
	}
	return make([]T, 0, n)
}

func (s *slabPool[T]) put(b []T) {
	b = b[:0]
	s.p.Put(&b)
}

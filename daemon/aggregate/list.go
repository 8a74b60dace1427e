package aggregate

// An intrusive doubly linked list: entries carry their own links, so moving
// an entry to the front on every exchange allocates nothing, and an entry
// can sit on two lists at once (a closed flow is on the LRU list and on the
// closed list). Only writers touch the lists.

type links[E any] struct {
	prev, next *E
	on         bool
}

type linked[E any] interface {
	*E
	link(i int) *links[E]
}

// list keeps the most recent entry at the head; the tail is the oldest.
type list[E any, P linked[E]] struct {
	i          int // which of the entry's links this list uses
	head, tail *E
}

func (l *list[E, P]) contains(e *E) bool { return P(e).link(l.i).on }

func (l *list[E, P]) pushFront(e *E) {
	ln := P(e).link(l.i)
	ln.prev, ln.next, ln.on = nil, l.head, true
	if l.head != nil {
		P(l.head).link(l.i).prev = e
	} else {
		l.tail = e
	}
	l.head = e
}

func (l *list[E, P]) remove(e *E) {
	ln := P(e).link(l.i)
	if !ln.on {
		return
	}
	if ln.prev != nil {
		P(ln.prev).link(l.i).next = ln.next
	} else {
		l.head = ln.next
	}
	if ln.next != nil {
		P(ln.next).link(l.i).prev = ln.prev
	} else {
		l.tail = ln.prev
	}
	*ln = links[E]{}
}

func (l *list[E, P]) moveToFront(e *E) {
	if l.head == e {
		return
	}
	l.remove(e)
	l.pushFront(e)
}

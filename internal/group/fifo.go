package group

// fifo is a queue over one array that it reuses: a pop moves its head,
// a queue that empties starts again at the array's start, and a push that
// finds the array's end moves what is queued back to its start before it
// grows it. So a queue that drains between bursts (a stream's requests,
// the streams in turn, a request and its answer) allocates only to grow:
// a slice popped from the front (q = q[1:]) walks off its array and
// allocates again and again.
type fifo[T any] struct {
	buf  []T // the array, from its start; the queue is buf[head:]
	head int
}

func (f *fifo[T]) len() int { return len(f.buf) - f.head }

// front is the oldest; the queue must not be empty.
func (f *fifo[T]) front() *T { return &f.buf[f.head] }

func (f *fifo[T]) push(v T) {
	if len(f.buf) == cap(f.buf) && f.head > 0 {
		n := copy(f.buf, f.buf[f.head:])
		clear(f.buf[n:])
		f.buf, f.head = f.buf[:n], 0
	}
	f.buf = append(f.buf, v)
}

// pop drops the oldest; the queue must not be empty.
func (f *fifo[T]) pop() {
	var zero T
	f.buf[f.head] = zero // drop what it refers to
	f.head++
	if f.head == len(f.buf) {
		f.buf, f.head = f.buf[:0], 0
	}
}

// deleteFunc drops what del matches, keeping the order of the rest.
func (f *fifo[T]) deleteFunc(del func(T) bool) {
	q := f.buf[f.head:]
	n := 0
	for _, v := range q {
		if !del(v) {
			q[n] = v
			n++
		}
	}
	clear(q[n:])
	f.buf = f.buf[:f.head+n]
	if f.head == len(f.buf) {
		f.buf, f.head = f.buf[:0], 0
	}
}

// reset empties the queue and keeps the array.
func (f *fifo[T]) reset() {
	clear(f.buf)
	f.buf, f.head = f.buf[:0], 0
}

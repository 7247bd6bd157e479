// fanout: `List(Option<Rc<Node>>)` instead of `List(Rc<Node>)` with a `Nil` node, so that
// long lists (paths, variable bindings) can be dropped iteratively (see `Drop`); a recursive
// drop of a list of a million elements would overflow the stack.
#[derive(Debug, PartialEq, Eq)]
pub struct List<T>(Option<alloc::rc::Rc<Node<T>>>);

#[derive(Clone, Debug, PartialEq, Eq)]
struct Node<T>(T, List<T>);

impl<T> Clone for List<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<T> Default for List<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Drop for List<T> {
    #[inline]
    fn drop(&mut self) {
        // empty or shared: dropping the field is enough
        if self.is_unique() {
            self.drop_unique();
        }
    }
}

impl<T> List<T> {
    #[inline(never)]
    fn drop_unique(&mut self) {
        let mut cur = self.0.take();
        while let Some(rc) = cur {
            match alloc::rc::Rc::try_unwrap(rc) {
                // the node's value is dropped here, its tail in the next iteration
                Ok(mut node) => cur = node.1 .0.take(),
                // shared: dropping our reference is enough
                Err(_) => break,
            }
        }
    }
}

impl<T: Clone> List<T> {
    pub fn pop(mut self) -> Option<(T, Self)> {
        let rc = self.0.take()?;
        let Node(head, tail) = alloc::rc::Rc::try_unwrap(rc).unwrap_or_else(|rc| (*rc).clone());
        Some((head, tail))
    }
}

impl<T> List<T> {
    /// Return an empty list.
    pub fn new() -> Self {
        Self(None)
    }

    /// Append a new element to the list.
    pub fn cons(self, x: T) -> Self {
        Self(Some(Node(x, self).into()))
    }

    /// Repeatedly add elements to the list.
    pub fn extend(self, iter: impl IntoIterator<Item = T>) -> Self {
        iter.into_iter().fold(self, Self::cons)
    }

    /// Return the element most recently added to the list.
    pub fn head(&self) -> Option<&T> {
        self.0.as_ref().map(|node| &node.0)
    }

    /// Get the `n`-th element from the list, starting from the most recently added.
    pub fn get(&self, n: usize) -> Option<&T> {
        self.skip(n).head()
    }

    /// Remove the `n` top values from the list.
    ///
    /// If `n` is greater than the number of list elements, return nil.
    pub fn skip(&self, n: usize) -> &Self {
        let mut cur = self;
        for _ in 0..n {
            match &cur.0 {
                Some(node) => cur = &node.1,
                None => break,
            }
        }
        cur
    }

    pub fn iter(&self) -> Iter<'_, T> {
        Iter(self)
    }

    /// fanout: whether the list is not empty and its first node is not shared.
    #[inline]
    pub fn is_unique(&self) -> bool {
        self.0
            .as_ref()
            .is_some_and(|rc| alloc::rc::Rc::strong_count(rc) == 1)
    }

    /// fanout: if the list is not empty and its first node is not shared, take it apart.
    pub fn pop_unique(mut self) -> Result<(T, Self), Self> {
        match self.0.take().map(alloc::rc::Rc::try_unwrap) {
            Some(Ok(Node(head, tail))) => Ok((head, tail)),
            Some(Err(rc)) => Err(Self(Some(rc))),
            None => Err(self),
        }
    }
}

pub struct Iter<'a, T>(&'a List<T>);

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;
    fn next(&mut self) -> Option<Self::Item> {
        let node = self.0 .0.as_ref()?;
        self.0 = &node.1;
        Some(&node.0)
    }
}

#[test]
fn test() {
    use alloc::{vec, vec::Vec};
    let eq = |l: &List<_>, a| assert_eq!(l.iter().cloned().collect::<Vec<_>>(), a);

    let l = List::new().cons(2).cons(1).cons(0);
    eq(&l, vec![0, 1, 2]);

    eq(l.skip(0), vec![0, 1, 2]);
    eq(l.skip(1), vec![1, 2]);
    eq(l.skip(2), vec![2]);
    eq(l.skip(3), vec![]);

    assert_eq!(l.get(0), Some(&0));
    assert_eq!(l.get(1), Some(&1));
    assert_eq!(l.get(2), Some(&2));
    assert_eq!(l.get(3), None);
}

#[test]
fn drop_long() {
    let l = List::new().extend(0..1_000_000);
    let shared = l.skip(10).clone();
    drop(l);
    assert_eq!(shared.head(), Some(&999_989));
}

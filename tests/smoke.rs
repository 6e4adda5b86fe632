mod common;
use common::*;
use mha::{Isa, Matrix, Mha, MhaParams, Tensor};

fn check<const B: usize, const T: usize, const D: usize>(h: usize, seed: u64) {
    let mut rng = Rng::new(seed);
    let x = Tensor::<B, T, D>::from_vec(rng.vec(B * T * D, 1.0)).unwrap();
    let s = 1.0 / (D as f32).sqrt();
    let w: Vec<Matrix<D, D>> = (0..4)
        .map(|_| Matrix::from_vec(rng.vec(D * D, s)).unwrap())
        .collect();
    let p = MhaParams::new(w[0].clone(), w[1].clone(), w[2].clone(), w[3].clone());
    let want = reference_mha(
        x.as_slice(),
        w[0].as_slice(),
        w[1].as_slice(),
        w[2].as_slice(),
        w[3].as_slice(),
        B,
        T,
        D,
        h,
    );
    for isa in Isa::ALL.into_iter().filter(|i| i.is_supported()) {
        for threads in [1, 2, 3] {
            let y = Mha::with_isa(&p, h, isa)
                .unwrap()
                .with_threads(threads)
                .with_min_work_per_thread(0)
                .forward(&x);
            assert_close(
                y.as_slice(),
                &want,
                1e-4,
                1e-4,
                &format!("{isa:?} B{B} T{T} D{D} H{h} threads {threads}"),
            );
        }
    }
}

#[test]
fn smoke() {
    check::<1, 2, 4>(2, 1);
    check::<1, 1, 1>(1, 2);
    check::<2, 7, 6>(3, 3);
    check::<3, 65, 12>(4, 4);
    check::<1, 130, 64>(2, 5);
    check::<2, 200, 96>(3, 6);
}
